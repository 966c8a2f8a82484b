// The time authority (wit/clock.wit, clock.js): a server clock's readings
// follow the layout's vectors and its reading rule; a guard judges time by
// its store's clock, fails closed until that clock has been read, and refuses
// a lease a renewal could not keep; and a step of this process's wall clock
// changes no decision — in this process (Date.now stepped) and in a child
// under libfaketime sharing a Redis or PostgreSQL store with this one.

import assert from 'node:assert/strict';
import { execFile, spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { promisify } from 'node:util';
import { redisTimeMs } from '../clock.js';
import { checkLeaseRenewable, Guard, GuardError, localClock, ManualClock, MemoryStore, SyncedClock, wallOffsetMs } from '../index.js';
import { asyncOver } from '../testing/async-store.js';
import { postgresStore, redisStore, skipWithout } from '../testing/netstores.js';

const vectors = JSON.parse(readFileSync(new URL('../../../wit/store-layout/vectors.json', import.meta.url), 'utf8')).time;
const n = (s) => Number(BigInt(s));

test("a Redis TIME reply reads as the layout's vectors say", () => {
  assert.ok(vectors.redis_time.length >= 4);
  for (const { reply, ms } of vectors.redis_time) {
    assert.equal(redisTimeMs(reply), BigInt(ms), JSON.stringify(reply));
    assert.equal(redisTimeMs(reply.map((part) => Buffer.from(part))), BigInt(ms), 'as the bulk strings RESP gives');
  }
  assert.throws(() => redisTimeMs(['1765000000']), /expected TIME's \[seconds, microseconds\]/);
  assert.throws(() => redisTimeMs(['-1', '0']), /TIME answered "-1", not a whole number/);
});

test("a reading's time and error bound follow the layout's vectors", () => {
  assert.ok(vectors.readings.length >= 2);
  for (const r of vectors.readings) {
    const clock = new SyncedClock('vectors');
    clock.adopt(n(r.server_ms), n(r.sent), n(r.received));
    assert.equal(clock.at(n(r.at)), n(r.now_ms), JSON.stringify(r));
    assert.equal(clock.errorAt(n(r.at)), n(r.error_ms), JSON.stringify(r));
  }
});

test('round-trip jitter keeps the time; a more precise reading is taken; a step of the server is followed and counted', () => {
  const T = 10_000_000;
  const clock = new SyncedClock('s');
  clock.adopt(T, 0, 10); // offset T - 5, error 6
  assert.equal(clock.at(10), T + 5);
  clock.adopt(T + 103, 100, 120); // offset T - 7, error 11: slower and within the bounds
  assert.equal(clock.at(10), T + 5, 'kept');
  clock.adopt(T + 201, 200, 202); // offset T, error 2
  assert.equal(clock.at(10), T + 10, 'more precise: taken');
  assert.equal(clock.steps, 0);
  clock.adopt(T + 301 - 3_600_000, 300, 302); // the server's clock set back an hour
  assert.equal(clock.at(10), T + 10 - 3_600_000);
  assert.deepEqual([clock.steps, clock.lastStepMs], [1, -3_600_000]);
  // A reading that disagrees beyond both bounds, but by less than a second: followed, not counted as a step.
  clock.adopt(T + 420 - 3_600_000, 400, 402);
  assert.equal(clock.at(10), T + 29 - 3_600_000);
  assert.equal(clock.steps, 1);
});

test('a server clock is unknown until read, says why a read failed, and then answers from the monotonic clock', async () => {
  const clock = new SyncedClock("a test server's clock");
  assert.equal(clock.unknown(), "a test server's clock has not been read yet");
  assert.equal(clock.errorMs(), null);
  await clock.read(async () => {
    throw new Error('connection refused');
  });
  assert.equal(clock.unknown(), "a test server's clock has not been read yet (reading it failed: connection refused)");
  await clock.read(() => 'not a time');
  assert.match(clock.unknown(), /reading it failed: the server's time NaN is not milliseconds since the epoch/);
  const before = Math.floor(performance.now());
  await clock.read(async () => 5_000_000_000n);
  const after = Math.floor(performance.now());
  assert.equal(clock.unknown(), null);
  const now = Number(clock.nowMs());
  assert.ok(now >= 5_000_000_000 - (after - before) && now <= 5_000_000_000 + (after - before) + 1, String(now));
  assert.ok(clock.errorMs() >= 1 && clock.errorMs() <= after - before + 2, String(clock.errorMs()));
  // A failure once read keeps the time.
  await clock.read(async () => {
    throw new Error('down');
  });
  assert.equal(clock.unknown(), null);
  assert.ok(Number(clock.nowMs()) >= now);
});

test('keepSynced reads again every period until stop()', async () => {
  const clock = new SyncedClock('s');
  let reads = 0;
  clock.keepSynced(100, () => {
    reads += 1;
    return 1_000_000 + reads * 3_600_000; // an hour on at every read: each one a step
  });
  for (const start = performance.now(); clock.steps < 1; await new Promise((resolve) => setTimeout(resolve, 10))) {
    if (performance.now() - start > 10_000) assert.fail('not read twice within 10 s');
  }
  clock.stop();
  const stoppedAt = reads;
  await new Promise((resolve) => setTimeout(resolve, 300));
  assert.ok(reads <= stoppedAt + 1, `${reads} reads after stop at ${stoppedAt}`); // one may have been under way
});

test('until its clock has been read the guard fails every call closed, naming why, and runs nothing; fingerprint still answers', async () => {
  const clock = new SyncedClock("the test server's clock");
  const store = new MemoryStore();
  const guard = Guard.load({ store, clock, renewLease: false });
  const closed = (e) =>
    e instanceof GuardError && e.kind === 'unavailable' && e.detail === "the store's clock is not known: the test server's clock has not been read yet";
  assert.throws(() => guard.begin('k', 'fp'), closed);
  const claim = { key: 'k', fingerprint: 'fp', fence: 1n, holder: 1n, leaseUntilMs: 0n, expiresAtMs: 0n };
  assert.throws(() => guard.complete(claim, { status: 200 }), closed);
  assert.throws(() => guard.release(claim), closed);
  assert.throws(() => guard.renew(claim), closed);
  assert.throws(() => guard.saveCheckpoint(claim, { phase: 'p' }), closed);
  assert.throws(() => guard.beginRequest('k', { method: 'POST', path: '/' }), closed);
  let runs = 0;
  const result = await guard.run('k', 'fp', () => ((runs += 1), { status: 200 }));
  assert.deepEqual([result.outcome, result.message, runs], ['unavailable', "the store's clock is not known: the test server's clock has not been read yet", 0]);
  assert.match(guard.fingerprint({ method: 'POST', path: '/' }), /^sha256:/);
  assert.equal(store.size, 0, 'nothing was stored');

  // An asynchronous guard rejects the same way, without a store call.
  const calls = [];
  const remote = asyncOver(store);
  const spied = { ...remote, clock, insert: (...args) => (calls.push('insert'), remote.insert(...args)) };
  const onRemote = Guard.load({ store: spied, renewLease: false });
  await assert.rejects(onRemote.begin('k', 'fp'), closed);
  assert.deepEqual(calls, []);

  // Once read, the same guards proceed at the server's time.
  await clock.read(async () => 1_765_000_000_000);
  const decision = guard.begin('k', 'fp');
  assert.equal(decision.tag, 'proceed');
  assert.ok(decision.val.leaseUntilMs >= 1_765_000_030_000n && decision.val.leaseUntilMs < 1_765_000_040_000n, String(decision.val.leaseUntilMs));
  assert.equal((await onRemote.begin('k', 'fp')).tag, 'in-flight');
});

test('a guard that purges does not, while its clock is unknown', async () => {
  const clock = new SyncedClock('s');
  const store = new MemoryStore();
  const early = Guard.load({ store, clock: new ManualClock(1_000), leaseMs: 10, retentionMs: 100, purgeEveryMs: 0 });
  early.complete(early.begin('k', 'fp').val, { status: 200 }); // expires at 1 100, long before any real time
  const guard = Guard.load({ store, clock, purgeEveryMs: 10 });
  await new Promise((resolve) => setTimeout(resolve, 200));
  assert.equal(guard.purgeStats.runs, 0, 'no purge by a guessed time');
  assert.equal(store.size, 1);
  await clock.read(async () => 1_765_000_000_000);
  for (const start = performance.now(); store.size > 0; await new Promise((resolve) => setTimeout(resolve, 10))) {
    if (performance.now() - start > 10_000) assert.fail('not purged within 10 s once the clock was read');
  }
  guard.close();
});

test("a guard's clock is its store's: MemoryStore's is the process's monotonic clock; a shared store without one is refused", () => {
  const memory = new MemoryStore();
  assert.equal(memory.clock, localClock);
  assert.equal(Guard.load({ store: memory }).clock, localClock);
  const manual = new ManualClock(5);
  assert.equal(Guard.load({ store: memory, clock: manual }).clock, manual);
  const own = new SyncedClock('own');
  assert.equal(Guard.load({ store: { ...asyncOver(memory), clock: own } }).clock, own);
  const primitives = { get: () => undefined, insert: () => ({ tag: 'inserted', val: 1n }), replace: () => false };
  assert.equal(Guard.load({ store: { ...primitives, processLocal: true } }).clock, localClock);
  assert.throws(
    () => Guard.load({ store: primitives }),
    (e) => e instanceof TypeError && /the store has no clock \(its time authority, wit\/clock\.wit\)/.test(e.message),
  );
  assert.throws(() => Guard.load({ store: memory, clock: { now: () => 1 } }), /clock: expected \{ nowMs\(\): bigint \}/);
  // The local clock: the wall clock at its anchor, carried by the monotonic clock.
  const a = localClock.nowMs();
  assert.ok(localClock.nowMs() >= a);
  assert.ok(Math.abs(wallOffsetMs(localClock)) < 5_000, String(wallOffsetMs(localClock)));
  assert.deepEqual([localClock.unknown(), localClock.errorMs()], [null, 0]);
});

test('a lease shorter than twice the store timeout is refused when the guard renews on the store clock, as the Rust host words it', () => {
  const store = { ...asyncOver(new MemoryStore()), clock: new SyncedClock('s'), timeoutMs: 2_000 };
  const refusal =
    "lease (3999 ms) must be at least twice store-timeout (2000 ms), i.e. at least 4000 ms: a renewal starts a third into the lease and may take the whole store timeout, so a shorter lease could lapse while its holder is alive; lengthen the lease or shorten the store timeout (Guard.load's leaseMs, the store's timeoutMs)";
  assert.throws(
    () => Guard.load({ store, leaseMs: 3_999 }),
    (e) => e instanceof RangeError && e.message === refusal,
  );
  assert.throws(() => checkLeaseRenewable(9_999, 5_000), /at least 10000 ms/);
  assert.equal(Guard.load({ store, leaseMs: 4_000 }).policy.leaseMs, 4_000n);
  assert.equal(Guard.load({ store, leaseMs: 3_999, renewLease: false }).renewLease, false, 'no renewals: nothing to keep');
  assert.ok(Guard.load({ store, leaseMs: 100, clock: new ManualClock(0) }), "a test's clock is not real time");
  assert.ok(Guard.load({ store: new MemoryStore(), leaseMs: 1 }), 'a store in memory has no timeout to wait out');
});

/** Runs `body` with Date.now (this process's wall clock) stepped by `stepMs`. */
async function withWallStep(stepMs, body) {
  const real = Date.now;
  Date.now = () => real.call(Date) + stepMs;
  try {
    return await body();
  } finally {
    Date.now = real;
  }
}

/** Renewed every 300 ms: a renewal may come 600 ms late on a loaded machine before the lease lapses. */
const LEASE_MS = 900;

for (const [what, stepMs] of [
  ['forward', 3_600_000],
  ['back', -3_600_000],
]) {
  test(`a wall-clock step ${what} by an hour changes no decision: leases, renewals and retention go by the store's clock`, async () => {
    // Over MemoryStore, on its clock (anchored before the step), and over a store on a server clock.
    localClock.nowMs();
    const server = new SyncedClock('a server');
    await server.read(async () => 1_765_000_000_000);
    for (const store of [new MemoryStore(), { ...asyncOver(new MemoryStore()), clock: server }]) {
      const [first, second] = [0, 1].map(() => Guard.load({ store, leaseMs: LEASE_MS, retentionMs: 60_000 }));
      const claim = await first.begin('k', 'fp');
      assert.equal(claim.tag, 'proceed');
      const executions = [];
      let repeat;
      // A handler slower than its lease, the wall clock stepped while it runs: renewed every third of the lease all the same.
      const outcome = await first.run('slow', 'fp', async () => {
        executions.push('first');
        return withWallStep(stepMs, async () => {
          const inFlight = await second.begin('k', 'fp');
          assert.equal(inFlight.tag, 'in-flight', 'the claim made before the step is still held');
          assert.ok(inFlight.val > 0n && inFlight.val <= BigInt(LEASE_MS), String(inFlight.val));
          await new Promise((resolve) => setTimeout(resolve, LEASE_MS * 2.2)); // past two leases: without renewals it would be taken over
          repeat = await second.run('slow', 'fp', async () => (executions.push('repeat'), { status: 200, body: 'repeat' }));
          return { status: 200, body: 'first' };
        });
      });
      assert.deepEqual(executions, ['first']);
      assert.equal(repeat.outcome, 'in-flight');
      assert.equal(outcome.outcome, 'executed');
      assert.equal((await second.run('slow', 'fp', () => ({ status: 500 }))).outcome, 'replayed', 'retained');
    }
  });
}

// A host whose wall clock is an hour ahead (libfaketime; its monotonic
// clock left alone) and this one share a store on a server: each sees the
// other's claim in flight for the rest of its lease, by the server's clock.

const run = promisify(execFile);
const index = new URL('../index.js', import.meta.url).href;

/** The faketime binary, or null when libfaketime is not installed (Debian: `faketime`). Asked synchronously: tests are registered before any await. */
const faketime = spawnSync('faketime', ['-f', '+0', 'true']).status === 0 ? 'faketime' : null;

for (const [name, env, open, module, options] of [
  [
    'Redis',
    'IDEM_TEST_REDIS_URL',
    () => redisStore(),
    'redis.js',
    (store) => `RedisStore.open({ url: process.env.IDEM_TEST_REDIS_URL, prefix: ${JSON.stringify(store.prefix)} })`,
  ],
  [
    'PostgreSQL',
    'IDEM_TEST_POSTGRES_URL',
    () => postgresStore(),
    'postgres.js',
    (store) => `PostgresStore.open({ url: process.env.IDEM_TEST_POSTGRES_URL, table: ${JSON.stringify(store.table)} })`,
  ],
]) {
  test(`${name}: a host whose wall clock is an hour ahead (faketime) and this one judge each other's leases by the server's clock`, {
    skip: skipWithout(env) || (faketime === null && 'libfaketime is not installed (apt-get install faketime)'),
  }, async () => {
    const store = await open();
    try {
      const guard = Guard.load({ store, leaseMs: 30_000, renewLease: false });
      assert.equal(guard.clock, store.clock, "the store's own clock");
      const mine = await guard.begin('mine', 'fp');
      assert.equal(mine.tag, 'proceed');
      const storeClass = module === 'redis.js' ? 'RedisStore' : 'PostgresStore';
      const script = `
        const { Guard, wallOffsetMs } = await import(${JSON.stringify(index)});
        const { ${storeClass} } = await import(${JSON.stringify(new URL(`../${module}`, import.meta.url).href)});
        const store = await ${options(store)};
        const guard = Guard.load({ store, leaseMs: 30_000, renewLease: false });
        const theirs = await guard.begin('mine', 'fp');
        const claimed = await guard.begin('theirs', 'fp');
        console.log(JSON.stringify({ wall: Date.now(), offset: wallOffsetMs(store.clock), theirs: theirs.tag, retry: String(theirs.val), claimed: claimed.tag }));
        await store.close();`;
      const started = Date.now();
      const { stdout } = await run(faketime, ['-f', '+1h', process.execPath, '--input-type=module', '-e', script], {
        env: { ...process.env, FAKETIME_DONT_FAKE_MONOTONIC: '1' },
        timeout: 60_000,
      });
      const child = JSON.parse(stdout);
      // The child's wall clock was an hour ahead of this process's: its guard took no notice.
      assert.ok(Math.abs(child.wall - started - 3_600_000) < 60_000, `the child's wall clock is ${child.wall - started} ms ahead of this one's`);
      assert.equal(child.theirs, 'in-flight', 'this claim, seen from an hour ahead: in flight');
      assert.ok(Number(child.retry) > 20_000 && Number(child.retry) <= 30_000, child.retry);
      assert.equal(child.claimed, 'proceed');
      const theirs = await guard.begin('theirs', 'fp');
      assert.equal(theirs.tag, 'in-flight', "the child's claim, seen from here: in flight");
      assert.ok(theirs.val > 20_000n && theirs.val <= 30_000n, String(theirs.val));
      // And the child saw how far its wall clock was off the store's time.
      assert.ok(Math.abs(child.offset - 3_600_000) < 60_000, `the child's wall clock is ${child.offset} ms off the server's`);
    } finally {
      await store.cleanUp();
    }
  });
}
