// RedisStore and PostgresStore against the on-store layout
// (wit/store-layout/README.md) and its vectors (vectors.json, from an
// independent encoder, which the Rust and Python stores are checked against
// too: a key one host writes is read by the others): the codecs alone, then
// what the stores write on a live server, byte for byte and column by
// column. Also: undecodable values are corrupt naming the key, and a server
// that does not answer in time fails the call as unavailable (the guard then
// runs nothing). The live tests need IDEM_TEST_REDIS_URL and
// IDEM_TEST_POSTGRES_URL (testing/netstores.js).

import assert from 'node:assert/strict';
import net from 'node:net';
import { test } from 'node:test';
import { Guard, ManualClock, StoreError } from '../index.js';
import { decodeRow, PostgresStore, recordParams, SCHEMA_VERSION } from '../postgres.js';
import { decodeValue, encodeValue, RedisStore } from '../redis.js';
import { dropTable, postgresStore, redisStore, serverUrl, skipWithout, sql, unique } from '../testing/netstores.js';
import { record, vectors } from '../testing/vectors.js';

const hex = (h) => Buffer.from(h, 'hex');
const I64_MAX = 2n ** 63n - 1n;

/** The record as PostgreSQL gives it back: u64 times past 2^63 - 1 saturated. */
const saturated = (r) => ({
  ...r,
  leaseUntilMs: r.leaseUntilMs > I64_MAX ? I64_MAX : r.leaseUntilMs,
  expiresAtMs: r.expiresAtMs > I64_MAX ? I64_MAX : r.expiresAtMs,
});

const isCorrupt = (key) => (e) => e instanceof StoreError && e.payload.tag === 'corrupt' && e.payload.val.includes(JSON.stringify(key));

// --- the codecs, against the vectors ------------------------------------------

test("vectors: each record encodes to the layout's Redis value and decodes back", () => {
  assert.ok(vectors.records.length >= 5);
  for (const v of vectors.records) {
    const r = record(v.record);
    assert.equal(encodeValue(BigInt(v.version), r).toString('hex'), v.redis, v.name);
    assert.deepEqual(decodeValue('k', hex(v.redis)), { record: r, version: BigInt(v.version) }, v.name);
  }
});

test('vectors: values of 0.1 hosts read as holder 0 with no checkpoint', () => {
  for (const v of vectors.legacy_redis) {
    assert.deepEqual(decodeValue('k', hex(v.redis)), { record: record(v.record), version: BigInt(v.version) }, v.name);
  }
});

test('vectors: corrupt Redis values are refused as corrupt, naming the key', () => {
  assert.ok(vectors.corrupt_redis.length >= 5);
  for (const v of vectors.corrupt_redis) assert.throws(() => decodeValue('the-key', hex(v.redis)), isCorrupt('the-key'), v.name);
});

/** The vector's columns as node-postgres returns them (BIGINT as decimal strings, BYTEA as Buffers). */
function columns(p) {
  const bytea = (h) => (h === null ? null : hex(h));
  return [
    p.version,
    p.fingerprint,
    p.state,
    p.lease_until_ms,
    p.expires_at_ms,
    p.status,
    p.header_names,
    p.header_values === null ? null : p.header_values.map(bytea),
    bytea(p.body),
    p.holder,
    p.phase,
    bytea(p.checkpoint),
  ];
}

test('vectors: each record as PostgreSQL parameters and columns', () => {
  for (const v of vectors.records) {
    const r = record(v.record);
    const params = recordParams(r).map((x) =>
      typeof x === 'bigint'
        ? String(x)
        : x instanceof Uint8Array
          ? Buffer.from(x).toString('hex')
          : Array.isArray(x)
            ? x.map((y) => (y instanceof Uint8Array ? Buffer.from(y).toString('hex') : y))
            : x,
    );
    const p = v.postgres;
    assert.deepEqual(
      params,
      [p.fingerprint, p.state, p.lease_until_ms, p.expires_at_ms, p.status, p.header_names, p.header_values, p.body, p.holder, p.phase, p.checkpoint],
      v.name,
    );
    assert.deepEqual(decodeRow('k', columns(p)), { record: saturated(r), version: BigInt(v.version) }, v.name);
  }
});

// --- Redis, live ------------------------------------------------------------------

const REDIS = 'IDEM_TEST_REDIS_URL';

/** A raw client on the test server. */
async function rawRedis() {
  const { Redis } = await import('ioredis');
  return new Redis(serverUrl(REDIS));
}

test("Redis: a store writes each vector record byte for byte, and reads the vectors' values back", { skip: skipWithout(REDIS) }, async () => {
  const store = await redisStore();
  const raw = await rawRedis();
  try {
    for (const [i, v] of vectors.records.entries()) {
      const key = `rec-${i}`;
      const r = record(v.record);
      const now = 0n;
      // Read: the vector's bytes as another host wrote them.
      await raw.set(`${store.prefix}${key}`, hex(v.redis));
      assert.deepEqual(await store.get(key, now), { record: r, version: BigInt(v.version) }, v.name);
      assert.equal(await store.delete(key, undefined, now), true, v.name);
      // PX of a record that expires at the top of u64 is past what Redis takes: that one is checked as bytes only.
      if (r.expiresAtMs > I64_MAX) continue;
      // Write: claimed at version 1, then replaced up to the vector's version.
      assert.deepEqual(await store.insert(key, r, now), { tag: 'inserted', val: 1n }, v.name);
      for (let at = 1n; at < BigInt(v.version); at++) assert.equal(await store.replace(key, at, r, now), true, v.name);
      assert.equal((await raw.getBuffer(`${store.prefix}${key}`)).toString('hex'), v.redis, v.name);
      const ttl = await raw.pttl(`${store.prefix}${key}`);
      assert.ok(ttl > Number(r.expiresAtMs - now) && ttl <= Number(r.expiresAtMs - now) + 60_000, `${v.name}: PX ${ttl}`);
    }
    for (const [i, v] of vectors.legacy_redis.entries()) {
      await raw.set(`${store.prefix}legacy-${i}`, hex(v.redis));
      assert.deepEqual(await store.get(`legacy-${i}`, 0n), { record: record(v.record), version: BigInt(v.version) }, v.name);
    }
  } finally {
    raw.disconnect();
    await store.cleanUp();
  }
});

test('Redis: undecodable values and keys of another type are corrupt, naming the key', { skip: skipWithout(REDIS) }, async () => {
  const store = await redisStore();
  const raw = await rawRedis();
  const claim = record(vectors.records[0].record);
  try {
    for (const [i, v] of vectors.corrupt_redis.entries()) {
      await raw.set(`${store.prefix}bad-${i}`, hex(v.redis));
      await assert.rejects(store.get(`bad-${i}`, 0n), isCorrupt(`bad-${i}`), v.name);
    }
    await assert.rejects(store.insert('bad-0', claim, 0n), isCorrupt('bad-0'));
    await assert.rejects(store.replace('bad-0', 1n, claim, 0n), isCorrupt('bad-0'));
    await raw.hset(`${store.prefix}hash`, 'version', '1');
    await assert.rejects(store.get('hash', 0n), isCorrupt('hash'));
    await assert.rejects(store.insert('hash', claim, 0n), isCorrupt('hash'));
  } finally {
    raw.disconnect();
    await store.cleanUp();
  }
});

test('Redis: an expired record Redis still holds is claimed at its version + 1; replace refuses a stale version; delete leaves an expired record alone', {
  skip: skipWithout(REDIS),
}, async () => {
  const store = await redisStore();
  const raw = await rawRedis();
  try {
    const r = { fingerprint: 'fp', state: 'processing', holder: 1n, leaseUntilMs: 500n, expiresAtMs: 1_000n };
    assert.deepEqual(await store.insert('k', r, 0n), { tag: 'inserted', val: 1n });
    assert.equal(await store.replace('k', 1n, r, 0n), true);
    assert.equal(await store.replace('k', 1n, r, 0n), false);
    assert.equal(await store.get('k', 1_000n), undefined, "expired by the guard's clock");
    assert.deepEqual(await store.insert('k', { ...r, expiresAtMs: 5_000n }, 1_000n), { tag: 'inserted', val: 3n });
    assert.equal(await store.replace('k', 3n, r, 5_000n), false, 'expired at the expected version');
    assert.equal(await store.delete('k', 2n, 1_000n), false, 'another version');
    assert.equal(await store.delete('k', 3n, 5_000n), false, 'expired at now: left alone');
    assert.equal(await store.delete('k', undefined, 5_000n), false, 'expired, without a version too');
    assert.ok(await raw.exists(`${store.prefix}k`), 'the expired record is still there for Redis to drop');
    assert.equal(await store.delete('k', 3n, 4_999n), true, 'live at 4 999');
    assert.equal(await store.delete('k', undefined, 0n), false, 'absent');
    // A value whose header does not decode is removed only without a version.
    await raw.set(`${store.prefix}bad`, 'no header');
    assert.equal(await store.delete('bad', 1n, 0n), false);
    assert.equal(await store.delete('bad', undefined, 0n), true);
    // Without a time: now by the store's own clock (the server's), where a record expiring in an hour is live.
    const inAnHour = store.clock.nowMs() + 3_600_000n;
    assert.deepEqual(await store.insert('now', { ...r, expiresAtMs: inAnHour }, store.clock.nowMs()), { tag: 'inserted', val: 1n });
    assert.equal(await store.delete('now'), true);
  } finally {
    raw.disconnect();
    await store.cleanUp();
  }
});

/**
 * A TCP proxy to `port` on 127.0.0.1 that can be told to stop passing
 * replies on (`hold()`): a server that stopped answering.
 */
async function proxy(port) {
  let held = false;
  const sockets = new Set();
  const server = net.createServer((client) => {
    const upstream = net.connect(port, '127.0.0.1');
    sockets.add(client).add(upstream);
    client.on('data', (d) => upstream.write(d));
    upstream.on('data', (d) => held || client.write(d));
    for (const s of [client, upstream]) s.on('error', () => {}).on('close', () => (client.destroy(), upstream.destroy()));
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    port: server.address().port,
    hold: () => (held = true),
    close: () => {
      for (const s of sockets) s.destroy();
      server.close();
    },
  };
}

const portOf = (url) => Number(new URL(url).port || 0);

/** Once proxy `p` holds every reply, `run` over `store` answers unavailable (`message` says why) and runs nothing. */
async function runsNothingOnceHeld(store, p, message) {
  const guard = Guard.load({ store });
  p.hold();
  let runs = 0;
  const r = await guard.run('k', 'fp', () => ((runs += 1), { status: 200 }));
  assert.equal(r.outcome, 'unavailable');
  assert.match(r.message, message);
  assert.equal(runs, 0);
}

test('Redis: a server that does not answer in time fails the call as unavailable, and the guard runs nothing', { skip: skipWithout(REDIS) }, async () => {
  const url = new URL(serverUrl(REDIS));
  const p = await proxy(portOf(url.href) || 6379);
  url.host = `127.0.0.1:${p.port}`;
  const prefix = `${unique()}:`;
  const store = await RedisStore.open({ url: url.href, prefix, timeoutMs: 200 });
  try {
    await runsNothingOnceHeld(store, p, /redis store: no answer within 200 ms/);
  } finally {
    store.close().catch(() => {});
    p.close();
    // The claim reached Redis; only its reply was held.
    const raw = await rawRedis();
    await raw.del(`${prefix}k`);
    raw.disconnect();
  }
  await assert.rejects(RedisStore.open({ url: `redis://127.0.0.1:${p.port}`, timeoutMs: 200 }), /redis store: cannot open redis:\/\/127\.0\.0\.1/);
});

// --- PostgreSQL, live ---------------------------------------------------------------

const POSTGRES = 'IDEM_TEST_POSTGRES_URL';

test('PostgreSQL: a store writes each vector record column by column, and reads it back', { skip: skipWithout(POSTGRES) }, async () => {
  const store = await postgresStore();
  try {
    for (const [i, v] of vectors.records.entries()) {
      const key = `rec-${i}`;
      const r = record(v.record);
      assert.deepEqual(await store.insert(key, r, 0n), { tag: 'inserted', val: 1n }, v.name);
      // A version past BIGINT (the vector at the top of u64) cannot be reached: that row is compared but for its version.
      const reachable = BigInt(v.version) <= 100n;
      const version = reachable ? BigInt(v.version) : 1n;
      for (let at = 1n; at < version; at++) assert.equal(await store.replace(key, at, r, 0n), true, v.name);
      const { rows } = await store.sql(
        `SELECT version::text, fingerprint, state, lease_until_ms::text, expires_at_ms::text, status, header_names,
           header_values, body, holder::text, phase, checkpoint FROM ${store.table} WHERE key = $1`,
        [key],
      );
      const got = rows[0];
      const bytea = (b) => (b === null ? null : b.toString('hex'));
      const p = v.postgres;
      assert.deepEqual(
        { ...got, header_values: got.header_values?.map(bytea) ?? null, body: bytea(got.body), checkpoint: bytea(got.checkpoint) },
        { ...p, version: String(version) },
        v.name,
      );
      assert.deepEqual(await store.get(key, 0n), { record: saturated(r), version }, v.name);
    }
  } finally {
    await store.cleanUp();
  }
});

test('PostgreSQL: replace answers whether it wrote; delete removes a live row only, at its version when given', { skip: skipWithout(POSTGRES) }, async () => {
  const store = await postgresStore();
  try {
    const r = { fingerprint: 'fp', state: 'processing', holder: 1n, leaseUntilMs: 500n, expiresAtMs: 1_000n };
    assert.deepEqual(await store.insert('k', r, 0n), { tag: 'inserted', val: 1n });
    assert.equal(await store.replace('k', 1n, r, 0n), true);
    assert.equal(await store.replace('k', 1n, r, 0n), false, 'a stale version');
    assert.equal(await store.replace('k', 2n, r, 1_000n), false, 'expired');
    assert.equal(await store.delete('k', 1n, 0n), false, 'another version');
    assert.equal(await store.delete('k', 2n, 1_000n), false, 'expired at now: left alone');
    assert.equal(await store.delete('k', undefined, 1_000n), false, 'expired, without a version too');
    assert.equal(Number((await store.sql(`SELECT count(*) AS n FROM ${store.table}`)).rows[0].n), 1, 'the expired row is still there for the purge');
    assert.equal(await store.delete('k', 2n, 999n), true, 'live at 999');
    assert.equal(await store.delete('k', undefined, 0n), false, 'absent');
    // Without a time: now by the store's own clock (the server's), where a row expiring in an hour is live.
    const now = store.clock.nowMs();
    assert.deepEqual(await store.insert('now', { ...r, expiresAtMs: now + 3_600_000n }, now), { tag: 'inserted', val: 1n });
    assert.equal(await store.delete('now'), true);
  } finally {
    await store.cleanUp();
  }
});

test('PostgreSQL: a negative time or inconsistent response columns are corrupt, naming the key', { skip: skipWithout(POSTGRES) }, async () => {
  const store = await postgresStore();
  try {
    const r = record(vectors.records[1].record);
    await store.insert('neg', r, 0n);
    await store.insert('half', r, 0n);
    await store.sql(`UPDATE ${store.table} SET lease_until_ms = -1 WHERE key = 'neg'`);
    await store.sql(`UPDATE ${store.table} SET body = NULL WHERE key = 'half'`);
    await assert.rejects(store.get('neg', 0n), isCorrupt('neg'));
    await assert.rejects(store.get('half', 0n), isCorrupt('half'));
    await assert.rejects(store.insert('half', r, 0n), isCorrupt('half'));
  } finally {
    await store.cleanUp();
  }
});

test('PostgreSQL: purgeExpired deletes at most `limit` rows expired at `nowMs`, and a guard over the store purges them every period', {
  skip: skipWithout(POSTGRES),
}, async () => {
  const store = await postgresStore();
  const count = async () => Number((await store.sql(`SELECT count(*) AS n FROM ${store.table}`)).rows[0].n);
  const at = (expiresAtMs) => ({
    fingerprint: 'fp',
    state: 'done',
    holder: 1n,
    leaseUntilMs: 0n,
    expiresAtMs,
    response: { status: 200, headers: [], body: new Uint8Array([1]) },
  });
  try {
    for (const [key, expires] of [
      ['a', 100n],
      ['b', 200n],
      ['c', 300n],
      ['live', 10_000n],
    ])
      await store.insert(key, at(expires), 0n);
    assert.equal(await store.purgeExpired(99n, 10), 0, 'nothing has expired at 99');
    assert.equal(await store.purgeExpired(300n, 2), 2, 'at most the limit, the oldest expiry first');
    assert.equal((await store.sql(`SELECT key FROM ${store.table} ORDER BY key`)).rows.map((r) => r.key).join(), 'c,live');
    assert.equal(await store.purgeExpired(300n, 10), 1);
    await assert.rejects(store.purgeExpired(300n, 0), /limit 0 must be a positive whole number/);

    const clock = new ManualClock(1_000);
    const guard = Guard.load({ store, clock, leaseMs: 10, retentionMs: 100, purgeEveryMs: 20 });
    for (const key of ['x', 'y']) {
      const decision = await guard.begin(key, 'fp');
      await guard.complete(decision.val, { status: 201, body: key });
    }
    assert.equal(await count(), 3);
    clock.advance(200);
    // Waited for by its count: rows are gone a moment before the run that deleted them is counted.
    for (const start = Date.now(); guard.purgeStats.purged < 2; await new Promise((resolve) => setTimeout(resolve, 10))) {
      if (Date.now() - start > 10_000) assert.fail(`the guard's purge did not delete the expired rows within 10 s: ${JSON.stringify(guard.purgeStats)}`);
    }
    guard.close();
    assert.equal(guard.purgeStats.errors, 0);
    assert.ok(guard.purgeStats.purged >= 2);
    assert.equal(await count(), 1);
  } finally {
    await store.cleanUp();
  }
});

test('PostgreSQL: the table name is checked, and a table of another schema version is refused', { skip: skipWithout(POSTGRES) }, async () => {
  const url = serverUrl(POSTGRES);
  for (const table of ['', '1abc', 'Idem', 'a-b', 'x'.repeat(49), 'idem; DROP TABLE x']) {
    await assert.rejects(PostgresStore.open({ url, table }), RangeError, table);
  }
  const table = unique();
  try {
    await (await PostgresStore.open({ url, table })).close();
    await sql(url, 'UPDATE idem_schema SET version = 3 WHERE table_name = $1', [table]);
    await assert.rejects(PostgresStore.open({ url, table }), new RegExp(`schema version 3; this package reads version ${SCHEMA_VERSION}`));
  } finally {
    await dropTable(url, table);
  }
});

test('PostgreSQL: a server that does not answer in time fails the call as unavailable, and the guard runs nothing', {
  skip: skipWithout(POSTGRES),
}, async () => {
  const url = new URL(serverUrl(POSTGRES));
  const p = await proxy(portOf(url.href) || 5432);
  url.host = `127.0.0.1:${p.port}`;
  const table = unique();
  const store = await PostgresStore.open({ url: url.href, table, timeoutMs: 300, poolSize: 1 });
  try {
    await runsNothingOnceHeld(store, p, /postgres store: /);
  } finally {
    p.close();
    await store.close().catch(() => {});
    await dropTable(serverUrl(POSTGRES), table);
  }
});

test('Redis: the Express middleware over RedisStore runs the route once and replays it', { skip: skipWithout(REDIS) }, async () => {
  const { default: express } = await import('express');
  const { createServer } = await import('node:http');
  const { idempotency } = await import('../express.js');
  const store = await redisStore();
  const server = createServer(
    express()
      .use(idempotency({ guard: Guard.load({ store }) }))
      .post('/orders', (req, res) =>
        res
          .status(201)
          .type('text/plain')
          .send(`run ${(runs += 1)}`),
      ),
  );
  let runs = 0;
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  try {
    const url = `http://127.0.0.1:${server.address().port}/orders`;
    const post = () => fetch(url, { method: 'POST', headers: { 'idempotency-key': 'order-1' }, body: 'x' });
    const first = await post();
    const again = await post();
    assert.deepEqual([first.status, await first.text()], [201, 'run 1']);
    assert.deepEqual([again.status, await again.text(), again.headers.get('idempotent-replayed')], [201, 'run 1', 'true']);
    assert.equal(runs, 1);
  } finally {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
    await store.cleanUp();
  }
});
