// What the Node.js guard does beyond the shared scenarios: a trapped instance
// is replaced, `run` renews a slow handler's lease, a retry resumes a crashed
// handler from its checkpoint, a lost renewal reply does not make the
// handler run twice, and expired records are purged in the background.
// (The examples' own tests are in examples/js/test.)

import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Guard, GuardError, ManualClock, MemoryStore, NotRecordedError } from '../index.js';

test('a host bug traps the instance: the call fails closed and the next call gets a fresh instance', () => {
  const store = new MemoryStore();
  const guard = Guard.load({ store, clock: new ManualClock(1_000), leaseMs: 100, retentionMs: 10_000 });
  const claim = guard.begin('k', 'fp').val;
  store.fault('replace', { kind: 'trap', count: 1 });
  assert.throws(
    () => guard.complete(claim, { status: 200, body: 'x' }),
    (e) => e instanceof GuardError && e.kind === 'unavailable' && e.detail.includes('instance replaced'),
  );
  assert.equal(guard.replaced, 1);
  // The new instance works, and the trapped call wrote nothing: the claim still holds.
  assert.deepEqual(guard.begin('k', 'fp'), { tag: 'in-flight', val: 100n });
  guard.complete(claim, { status: 200, body: 'x' });
  assert.equal(guard.begin('k', 'fp').tag, 'replay');
});

test('a call the binding refuses to lower (status over u16) fails closed, and the guard keeps working', () => {
  const guard = Guard.load({ store: new MemoryStore(), clock: new ManualClock(1_000), leaseMs: 100, retentionMs: 10_000 });
  // The binding throws while lowering, mid-call; the instance is dropped rather than trusted again.
  assert.throws(() => guard.complete({ key: 'k', fingerprint: 'f', fence: 1n, leaseUntilMs: 0n, expiresAtMs: 0n }, { status: 70_000, body: '' }), GuardError);
  assert.equal(guard.begin('k', 'fp').tag, 'proceed');
});

// A handler slower than its lease, on the system clock and real timers:
// halfway through, a repeat of the same request arrives at a second guard
// over the same store.
const LEASE_MS = 400;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function slowHandlerAndRepeat({ renewLease, beforeHandler = () => {} }) {
  const store = new MemoryStore();
  const [first, second] = [0, 1].map(() => Guard.load({ store, leaseMs: LEASE_MS, retentionMs: 60_000, renewLease }));
  const executions = [];
  let repeat;
  const outcome = first.run('slow', 'fp', async () => {
    executions.push('first');
    beforeHandler(store);
    await sleep(LEASE_MS * 2.5);
    repeat = await second.run('slow', 'fp', async () => (executions.push('repeat'), { status: 200, body: 'repeat' }));
    return { status: 200, body: 'first' };
  });
  return { outcome: await outcome.catch((e) => e), repeat, executions, later: await second.run('slow', 'fp', async () => ({ status: 500, body: 'later' })) };
}

test('run renews the lease while a slow handler runs: a repeat is told in flight and the handler runs once', async () => {
  const { outcome, repeat, executions, later } = await slowHandlerAndRepeat({ renewLease: true });
  assert.deepEqual(executions, ['first']);
  assert.equal(repeat.outcome, 'in-flight');
  assert.equal(outcome.outcome, 'executed');
  assert.equal(later.outcome, 'replayed');
  assert.equal(new TextDecoder().decode(later.response.body), 'first');
});

test('without renewal the same handler is taken over and runs twice, and its response is not recorded', async () => {
  const { outcome, repeat, executions } = await slowHandlerAndRepeat({ renewLease: false });
  assert.deepEqual(executions, ['first', 'repeat']);
  assert.equal(repeat.outcome, 'executed');
  assert.ok(outcome instanceof NotRecordedError, `${outcome}`);
  assert.equal(outcome.error.kind, 'stale-claim');
});

test('a renewal the store fails is tried again before the lease runs out', async () => {
  const { outcome, repeat, executions } = await slowHandlerAndRepeat({
    renewLease: true,
    beforeHandler: (store) => store.fault('replace', { kind: 'error', message: 'store down', count: 1 }),
  });
  assert.deepEqual(executions, ['first']);
  assert.equal(repeat.outcome, 'in-flight');
  assert.equal(outcome.outcome, 'executed');
});

test('a missing component file is named, with the command that writes it', () => {
  const missing = '/nonexistent/idem-guard.wasm';
  assert.throws(
    () => Guard.load({ store: new MemoryStore(), component: missing }),
    (e) => e.message.includes(missing) && e.message.includes('idem component --out') && e.message.includes('IDEM_COMPONENT'),
  );
});

// Checkpoints: two processes over one store and clock; the first dies in
// the middle of its handler (its promise never settles, and a dead process
// renews nothing).
test('a handler that checkpoints and crashes: the retry after its lease resumes from the checkpoint', async () => {
  const store = new MemoryStore();
  const clock = new ManualClock(1_000_000);
  const [crashing, retrying] = [0, 1].map(() => Guard.load({ store, clock, leaseMs: 1_000, retentionMs: 60_000, renewLease: false }));
  const effects = [];
  let unfreeze;
  const zombie = crashing.run('order-1', 'fp', async (_fence, attempt) => {
    assert.equal(attempt.checkpoint, null, 'a fresh claim has no checkpoint');
    effects.push('charge');
    attempt.saveCheckpoint('charged', 'receipt-7');
    await new Promise((resolve) => (unfreeze = resolve)); // the process dies here
    return { status: 200, body: 'zombie' };
  });
  const order = async (_fence, attempt) => {
    if (attempt.checkpoint?.phase !== 'charged') effects.push('charge');
    effects.push(`ship ${new TextDecoder().decode(attempt.checkpoint?.data ?? new Uint8Array())}`);
    return { status: 201, body: 'shipped' };
  };

  assert.equal((await retrying.run('order-1', 'fp', order)).outcome, 'in-flight', 'within the lease');
  clock.advance(1_000);
  const retry = await retrying.run('order-1', 'fp', order);
  assert.equal(retry.outcome, 'executed');
  assert.deepEqual(effects, ['charge', 'ship receipt-7'], 'charged once, shipped from the checkpoint');
  assert.equal(store.peek('order-1', clock.nowMs()).record.checkpoint, undefined, 'complete drops the checkpoint');

  unfreeze(); // the zombie wakes: its claim was taken over
  const late = await zombie.catch((e) => e);
  assert.ok(late instanceof NotRecordedError && late.error.kind === 'stale-claim', `${late}`);
  const again = await retrying.run('order-1', 'fp', order);
  assert.equal(again.outcome, 'replayed');
  assert.equal(new TextDecoder().decode(again.response.body), 'shipped');
});

test('a handler written for one argument still runs, and a failed one releases with its checkpoint kept', async () => {
  const store = new MemoryStore();
  const clock = new ManualClock(1_000_000);
  const guard = Guard.load({ store, clock, leaseMs: 1_000, retentionMs: 60_000, renewLease: false });
  const failed = guard.run('k', 'fp', async (_fence, attempt) => {
    attempt.saveCheckpoint('step-1', Uint8Array.of(0, 255));
    throw new Error('step 2 failed');
  });
  await assert.rejects(failed, /step 2 failed/);
  let resumed;
  const retry = await guard.run('k', 'fp', async (_fence, attempt) => ((resumed = attempt.checkpoint), { status: 200 }));
  assert.equal(retry.outcome, 'executed', 'the release let the retry proceed at once');
  assert.deepEqual(resumed, { phase: 'step-1', data: Uint8Array.of(0, 255) });
  assert.equal((await guard.run('k2', 'fp', async (fence) => ({ status: 200, body: String(fence) }))).outcome, 'executed');
});

test('a lost renewal reply does not make the handler run twice', async () => {
  const store = new MemoryStore();
  const clock = new ManualClock(1_000_000);
  const leaseMs = 300; // renewed every 100 ms of real time
  const [first, second] = [0, 1].map(() => Guard.load({ store, clock, leaseMs, retentionMs: 60_000 }));
  const executions = [];
  let repeat;
  const outcome = await first.run('k', 'fp', async (_fence, attempt) => {
    executions.push('first');
    store.fault('replace', { kind: 'lost', count: 1 }); // the next renewal is applied, its reply lost
    clock.advance(200);
    for (let waited = 0; attempt.fence === 1n; waited += 10) {
      assert.ok(waited < 5_000, 'no renewal within 5 s');
      await sleep(10);
    }
    // Read back and found applied: fence 2. (Taken as failed, the next tick would have written fence 3.)
    assert.equal(attempt.fence, 2n);
    clock.advance(200); // past the first lease; within the renewed one
    repeat = await second.run('k', 'fp', async () => (executions.push('repeat'), { status: 200, body: 'repeat' }));
    return { status: 200, body: 'first' };
  });
  assert.equal(repeat.outcome, 'in-flight', 'the renewal was read back as applied');
  assert.equal(outcome.outcome, 'executed', 'and the completion went on from the renewed claim');
  assert.deepEqual(executions, ['first']);
  assert.equal((await second.run('k', 'fp', async () => ({ status: 500 }))).outcome, 'replayed');
});

// --- the purge of expired records ----------------------------------------------------

/** Waits (up to 10 s: a loaded machine's timers run late) until `done()`. */
async function eventually(done, what) {
  for (const start = Date.now(); !done(); await sleep(5)) {
    if (Date.now() - start > 10_000) assert.fail(`not within 10 s: ${what}`);
  }
}

test('MemoryStore.purgeExpired frees at most `limit` records expired at `nowMs` and keeps the live ones', () => {
  const store = new MemoryStore();
  const guard = Guard.load({ store, clock: new ManualClock(1_000), leaseMs: 10, retentionMs: 100, purgeEveryMs: 0 });
  for (const key of ['a', 'b', 'c']) guard.complete(guard.begin(key, 'fp').val, { status: 200, body: key }); // expire at 1 100
  const later = Guard.load({ store, clock: new ManualClock(1_050), leaseMs: 10, retentionMs: 100, purgeEveryMs: 0 });
  later.complete(later.begin('live', 'fp').val, { status: 200, body: 'live' }); // expires at 1 150
  assert.equal(store.purgeExpired(1_099n, 10), 0, 'nothing has expired yet');
  assert.equal(store.purgeExpired(1_100n, 2), 2, 'at most the limit');
  assert.equal(store.purgeExpired(1_100n, 10), 1);
  assert.equal(store.size, 1);
  assert.equal(store.peek('live', 1_100).record.state, 'done');
  assert.throws(() => store.purgeExpired(1_100n, 0), /limit 0 must be a positive whole number/);
  // A purged key is absent: another fingerprint is no conflict, it claims the key anew, from version 1.
  const again = guard.begin('a', 'other');
  assert.equal(again.tag, 'proceed');
  assert.equal(again.val.fence, 1n);
});

test("a guard purges its store's expired records every purgeEveryMs, in batches until one comes back short, until closed", async () => {
  const store = new MemoryStore();
  const clock = new ManualClock(1_000);
  const guard = Guard.load({ store, clock, leaseMs: 10, retentionMs: 100, purgeEveryMs: 20 });
  assert.equal(guard.purgeStats.everyMs, 20);
  for (let i = 0; i < 2_500; i++) guard.complete(guard.begin(`k${i}`, 'fp').val, { status: 200, body: 'x' });
  clock.advance(50); // none expired yet: a run purges nothing
  await eventually(() => guard.purgeStats.runs >= 1, 'a first purge run');
  assert.equal(store.size, 2_500);
  clock.advance(100);
  await eventually(() => store.size === 0, 'the 2 500 expired records purged');
  const run = guard.purgeStats;
  assert.equal(run.purged, 2_500);
  assert.equal(run.lastPurged, 2_500, 'one run, in three batches (1 000, 1 000, 500)');
  assert.equal(run.errors, 0);
  guard.close();
  const runs = guard.purgeStats.runs;
  guard.complete(guard.begin('after', 'fp').val, { status: 200, body: 'x' });
  clock.advance(1_000);
  await sleep(100);
  assert.equal(guard.purgeStats.runs, runs, 'no run after close');
  assert.equal(store.size, 1);
});

test('a purge that fails is counted and tried again next period; purgeEveryMs 0, or a store without purgeExpired, never purges', async () => {
  const failing = new MemoryStore();
  let fail = true;
  const purge = failing.purgeExpired.bind(failing);
  failing.purgeExpired = (now, limit) => {
    if (fail) throw new Error('disk on fire');
    return purge(now, limit);
  };
  const clock = new ManualClock(1_000);
  const guard = Guard.load({ store: failing, clock, leaseMs: 10, retentionMs: 100, purgeEveryMs: 10 });
  guard.complete(guard.begin('k', 'fp').val, { status: 200, body: 'x' });
  clock.advance(200);
  await eventually(() => guard.purgeStats.errors >= 1, 'a failed run');
  assert.equal(guard.purgeStats.lastError, 'disk on fire');
  assert.equal(failing.size, 1);
  fail = false;
  await eventually(() => failing.size === 0, 'the next period purging');
  guard.close();

  const off = Guard.load({ store: new MemoryStore(), purgeEveryMs: 0 });
  assert.equal(off.purgeStats.everyMs, 0);
  const noPurge = { get: () => undefined, insert: () => ({ tag: 'inserted', val: 1n }), replace: () => false, processLocal: true };
  assert.equal(Guard.load({ store: noPurge }).purgeStats.everyMs, 0);
  assert.throws(() => Guard.load({ purgeEveryMs: -1 }), /purgeEveryMs -1 must be a whole number of milliseconds, 0 for never/);
});

test('the purge does not keep a guard dropped without close() alive', async () => {
  // In a child process of its own with --expose-gc: the guard is finalized once dropped.
  const { execFileSync } = await import('node:child_process');
  const index = new URL('../index.js', import.meta.url).href;
  const script = `
    const { Guard, MemoryStore } = await import(${JSON.stringify(index)});
    let registry; // kept: a registry that is itself collected calls nothing back
    const finalized = new Promise((resolve) => {
      registry = new FinalizationRegistry(resolve);
      (() => registry.register(Guard.load({ store: new MemoryStore(), purgeEveryMs: 10 }), 'gone'))();
    });
    const timeout = setTimeout(() => { console.log('alive'); process.exit(0); }, 10_000);
    const collect = setInterval(() => globalThis.gc(), 20);
    console.log(await finalized);
    clearTimeout(timeout);
    clearInterval(collect);
  `;
  const out = execFileSync(process.execPath, ['--expose-gc', '--input-type=module', '-e', script], { encoding: 'utf8', env: process.env });
  assert.equal(out.trim(), 'gone');
});
