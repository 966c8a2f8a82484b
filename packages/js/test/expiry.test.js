// The expiry told to clients (issue #45): until when a key's stored response
// is replayed is the `expiresAtMs` of its stored record, and the guard
// learns it from the records its store calls pass — on `run`'s outcomes,
// `begin`'s replay and `complete`'s result — and the Express middleware
// sends it on every stored response as `Idempotency-Expires`, an HTTP-date
// rounded down to the second. Each expectation is read from the store
// itself, not from the clock.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import express from 'express';
import { httpDate, idempotency, scopedKey } from '../express.js';
import { Guard, ManualClock, MemoryStore } from '../index.js';
import { asyncOver } from '../testing/async-store.js';
import { redisStore, skipWithout } from '../testing/netstores.js';
import { serve } from '../testing/serve.js';

/** The `expiresAtMs` of `key`'s stored (done) record, read from the store as `now`. */
async function storedExpiry(store, key, now) {
  const entry = await store.get(key, BigInt(now));
  assert.equal(entry?.record.state, 'done', `${key} is stored`);
  return entry.record.expiresAtMs;
}

const respond = (body) => () => ({ status: 201, headers: [['content-type', 'text/plain']], body });

test("run: the executed and the replayed outcome carry the stored record's expiresAtMs, as a number", async () => {
  const clock = new ManualClock(1_000_000);
  const store = new MemoryStore();
  const guard = Guard.load({ store, clock, retentionMs: 60_000 });
  const first = await guard.run('k', 'fp', respond('paid'));
  const stored = await storedExpiry(store, 'k', clock.nowMs());
  assert.deepEqual([first.outcome, first.expiresAtMs], ['executed', Number(stored)]);
  assert.equal(stored, 1_060_000n, 'now + retention, on the guard clock');

  clock.advance(5_000); // the replay's expiry is the record's, not now + retention
  const again = await guard.run('k', 'fp', respond('other'));
  assert.deepEqual([again.outcome, again.expiresAtMs], ['replayed', Number(stored)]);
  assert.equal(typeof again.expiresAtMs, 'number');

  const conflict = await guard.run('k', 'another', respond('x'));
  assert.deepEqual(conflict, { outcome: 'conflict' });
});

test('begin: a replay carries its record expiresAtMs; complete returns the one it stored, also on a retry that finds it stored', () => {
  const clock = new ManualClock(2_000_000);
  const store = new MemoryStore();
  const guard = Guard.load({ store, clock, leaseMs: 1_000, retentionMs: 30_000, renewLease: false });
  const decision = guard.begin('k', 'fp');
  assert.equal(decision.tag, 'proceed');
  clock.advance(700);
  const until = guard.complete(decision.val, { status: 200, body: 'ok' });
  assert.equal(until, 2_030_700n);
  assert.equal(until, store.peek('k', clock.nowMs()).record.expiresAtMs);
  clock.advance(100);
  const replay = guard.begin('k', 'fp');
  assert.deepEqual([replay.tag, replay.expiresAtMs], ['replay', until]);

  // The reply to the completing write is lost: the guest reads the record back, sees
  // its own response stored, and succeeds without writing; the expiry is the one read.
  const claim = guard.begin('lost', 'fp').val;
  store.fault('replace', { kind: 'lost', count: 1 });
  clock.advance(1_000);
  const readBack = guard.complete(claim, { status: 200, body: 'ok' });
  assert.equal(readBack, store.peek('lost', clock.nowMs()).record.expiresAtMs);
  assert.equal(readBack, 2_031_800n);
  // Retried after that (its reply lost too, as far as the caller knows): the same record, the same expiry.
  clock.advance(1_000);
  assert.equal(guard.complete(claim, { status: 200, body: 'ok' }), readBack);
});

test('over an asynchronous store (journal replay), overlapping calls each get their own record expiry', async () => {
  const clock = new ManualClock(3_000_000);
  const inner = new MemoryStore();
  const guard = Guard.load({ store: asyncOver(inner), clock, leaseMs: 1_000, retentionMs: 10_000 });
  assert.equal(guard.async, true);
  const a = await guard.run('a', 'fp', respond('a'));
  clock.advance(2_000);
  const b = await guard.run('b', 'fp', respond('b'));
  const [ra, rb] = await Promise.all([guard.run('a', 'fp', respond('x')), guard.run('b', 'fp', respond('x'))]);
  assert.deepEqual(
    [a.expiresAtMs, b.expiresAtMs, ra.outcome, ra.expiresAtMs, rb.outcome, rb.expiresAtMs],
    [3_010_000, 3_012_000, 'replayed', 3_010_000, 'replayed', 3_012_000],
  );
  assert.equal(BigInt(ra.expiresAtMs), inner.peek('a', clock.nowMs()).record.expiresAtMs);
});

test('httpDate: IMF-fixdate, rounded down to the whole second', () => {
  assert.equal(httpDate(784_111_777_000), 'Sun, 06 Nov 1994 08:49:37 GMT');
  assert.equal(httpDate(784_111_777_999), 'Sun, 06 Nov 1994 08:49:37 GMT');
  assert.equal(httpDate(784_111_778_000), 'Sun, 06 Nov 1994 08:49:38 GMT');
});

const post = (url, key, body) => fetch(`${url}/orders`, { method: 'POST', headers: { 'idempotency-key': key }, body });

/** A promise and the function that resolves it. */
function signal() {
  let resolve;
  const promise = new Promise((r) => (resolve = r));
  return { promise, resolve };
}

/**
 * An app whose route answers 201 (or `x-status`); with `x-hold`, it says it
 * started (`gate.started`) and answers once `gate.open` resolves.
 */
function orders(options, gate = { started: signal(), open: signal() }) {
  const app = express();
  app.set('env', 'test');
  app.use(idempotency(options));
  let runs = 0;
  app.post('/orders', async (req, res) => {
    runs += 1;
    if (req.headers['x-hold']) {
      gate.started.resolve();
      await gate.open.promise;
    }
    res.status(Number(req.headers['x-status'] ?? 201)).send(`run ${runs}`);
  });
  return app;
}

/**
 * What every store shows through the middleware: the first response and the
 * replay carry the same Idempotency-Expires, the stored record's expiry
 * rounded down to the second; a 409, a 422 and a response not stored carry none.
 */
async function expiryOverHttp(guard, store) {
  const gate = { started: signal(), open: signal() };
  await serve(orders({ guard }, gate), async (url) => {
    const first = await post(url, 'k', 'order');
    const replay = await post(url, 'k', 'order');
    const expires = httpDate(Number(await storedExpiry(store, scopedKey(undefined, 'k'), guard.clock.nowMs())));
    assert.equal(first.status, 201);
    assert.equal(first.headers.get('idempotency-expires'), expires, 'the first response, once stored');
    assert.deepEqual([replay.status, replay.headers.get('idempotent-replayed'), await replay.text()], [201, 'true', 'run 1']);
    assert.equal(replay.headers.get('idempotency-expires'), expires, 'the replay: the same instant');
    assert.match(expires, /^[A-Z][a-z]{2}, \d{2} [A-Z][a-z]{2} \d{4} \d{2}:\d{2}:\d{2} GMT$/);

    const mismatch = await post(url, 'k', 'another order');
    assert.deepEqual([mismatch.status, mismatch.headers.get('idempotency-expires')], [422, null]);

    const held = fetch(`${url}/orders`, { method: 'POST', headers: { 'idempotency-key': 'slow', 'x-hold': '1' }, body: 'o' });
    await gate.started.promise; // its route runs under the claim: a repeat is 409
    const inFlight = await post(url, 'slow', 'o');
    assert.deepEqual([inFlight.status, inFlight.headers.get('idempotency-expires')], [409, null], 'no expiry on a 409');
    gate.open.resolve();
    const slow = await held;
    assert.equal(slow.headers.get('idempotency-expires'), httpDate(Number(await storedExpiry(store, scopedKey(undefined, 'slow'), guard.clock.nowMs()))));

    const failed = await fetch(`${url}/orders`, { method: 'POST', headers: { 'idempotency-key': 'e', 'x-status': '500' }, body: 'o' });
    assert.deepEqual([failed.status, failed.headers.get('idempotency-expires')], [500, null], 'a 5xx released, not stored');
  });
}

test('Express over MemoryStore: Idempotency-Expires on the first response and the replay, the stored expiry; none on 409, 422, 5xx', async () => {
  const store = new MemoryStore();
  await expiryOverHttp(Guard.load({ store }), store);
});

test('Express over RedisStore: the same, the expiry read back from Redis', { skip: skipWithout('IDEM_TEST_REDIS_URL') }, async () => {
  const store = await redisStore();
  try {
    await expiryOverHttp(Guard.load({ store }), store);
  } finally {
    await store.cleanUp();
  }
});

test('Express: the expiry is rounded down to the second, under the name expiryHeader gives; none on a response not recorded', async () => {
  // Stored at 08:48:37.999 with a minute's retention: expires at 08:49:37.999, told as 08:49:37.
  const clock = new ManualClock(784_111_717_999);
  const store = new MemoryStore();
  const guard = Guard.load({ store, clock, retentionMs: 60_000, leaseMs: 2_000 });
  await serve(orders({ guard, expiryHeader: 'x-key-expires' }), async (url) => {
    const first = await post(url, 'k', 'order');
    const replay = await post(url, 'k', 'order');
    assert.equal(store.peek(scopedKey(undefined, 'k'), clock.nowMs()).record.expiresAtMs, 784_111_777_999n);
    for (const r of [first, replay]) {
      assert.equal(r.headers.get('x-key-expires'), 'Sun, 06 Nov 1994 08:49:37 GMT');
      assert.equal(r.headers.get('idempotency-expires'), null);
    }
    store.fault('replace', { kind: 'error', count: 1 });
    const notRecorded = await post(url, 'k2', 'order');
    assert.deepEqual([notRecorded.status, notRecorded.headers.get('x-key-expires')], [503, null]);
  });
});
