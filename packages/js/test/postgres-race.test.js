// A PostgreSQL claim that loses the race to a concurrent claimer (`settle`).
//
// The store's `claim` statement reads the key and, when it is absent or
// expired, calls `{t}_try_claim`. If another claimer inserted the key and has
// not committed yet, `try_claim` waits on the unique key; once the winner
// commits it inserts nothing and returns NULL, and the store runs `settle`
// (wit/store-layout/postgres/statements.sql), which returns the winner's
// row. The test holds the winner's transaction open on a connection of its
// own until the store's claim is seen waiting on its lock, so the second
// round trip is taken every time, not by chance.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import { postgresStore, serverUrl, skipWithout } from '../testing/netstores.js';

const NOW = 1_000_000n;
const WINNER_HOLDER = 77n;

test("postgres: a claim that loses the race gets the winner's record and writes nothing", { skip: skipWithout('IDEM_TEST_POSTGRES_URL') }, async () => {
  const url = serverUrl('IDEM_TEST_POSTGRES_URL');
  const { default: pg } = await import('pg');
  // A timeout well above the wait: the claim must not give up while the winner holds the key.
  const store = await postgresStore({ timeoutMs: 20_000 });
  const winner = new pg.Client({ connectionString: url });
  const watch = new pg.Client({ connectionString: url });
  await winner.connect();
  await watch.connect();
  try {
    const table = store.table;
    const key = 'raced';
    await winner.query('BEGIN');
    await winner.query(
      `INSERT INTO ${table} (key, version, fingerprint, state, lease_until_ms, expires_at_ms, holder) VALUES ($1, 1, 'winner', 'processing', $2, $3, $4)`,
      [key, String(NOW + 30_000n), String(NOW + 3_600_000n), String(WINNER_HOLDER)],
    );
    const {
      rows: [{ pid: winnerPid }],
    } = await winner.query('SELECT pg_backend_pid() AS pid');
    const loser = { fingerprint: 'loser', state: 'processing', holder: 5n, leaseUntilMs: NOW + 30_000n, expiresAtMs: NOW + 3_600_000n };
    let finished = false;
    const claim = store.insert(key, loser, NOW).finally(() => {
      finished = true;
    });
    // Wait (no fixed sleep: CI machines are loaded) until the claim statement, on another backend, waits on a lock.
    const deadline = Date.now() + 30_000;
    for (;;) {
      const {
        rows: [{ n }],
      } = await watch.query(
        `SELECT count(*)::int AS n FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
          WHERE NOT l.granted AND a.datname = current_database() AND a.pid <> $1 AND a.query LIKE $2`,
        [winnerPid, `%${table}_try_claim%`],
      );
      if (n > 0) break;
      assert.ok(!finished, 'the claim finished without waiting on the winner');
      assert.ok(Date.now() < deadline, "the claim never waited on the winner's insert");
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    await winner.query('COMMIT');
    const outcome = await claim;
    assert.equal(outcome.tag, 'existing');
    assert.equal(outcome.val.version, 1n);
    assert.equal(outcome.val.record.fingerprint, 'winner');
    assert.equal(outcome.val.record.holder, WINNER_HOLDER);
    const { rows } = await watch.query(`SELECT version::int AS version, fingerprint, holder::text AS holder FROM ${table} WHERE key = $1`, [key]);
    assert.deepEqual(rows, [{ version: 1, fingerprint: 'winner', holder: String(WINNER_HOLDER) }], 'the losing claim wrote nothing');
  } finally {
    await winner.end();
    await watch.end();
    await store.cleanUp();
  }
});
