// The guard over an asynchronous store replays each call from a journal
// (journal.js): the store sees each primitive exactly once, in the order a
// synchronous store would; a store failure or lost reply part-way through a
// call fails closed; a guest that asks for something else on a replay fails
// closed without touching the store again; and on Redis and PostgreSQL,
// concurrent runs of one key run the handler once.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { Guest } from '../idem-abi.js';
import { Guard, GuardError, ManualClock, MemoryStore, StoreError } from '../index.js';
import { FaultyStore, postgresStore, redisStore, skipWithout } from '../testing/netstores.js';

const component = process.env.IDEM_COMPONENT || fileURLToPath(new URL('../idem-guard.wasm', import.meta.url));

/** Holder ids from a fixed sequence, so two guards draw the same ones. */
class Counter {
  n = 0n;
  randomU64() {
    this.n += 1n;
    return 0x1000n + this.n;
  }
}

const show = (v) => JSON.stringify(v, (_, x) => (typeof x === 'bigint' ? `${x}n` : x instanceof Uint8Array ? Buffer.from(x).toString('hex') : x));

/** A MemoryStore that logs every primitive with its arguments and answer; `async` answers in a later turn. */
function recording(log, async) {
  const inner = new MemoryStore();
  const call = (op, args) => {
    try {
      const value = inner[op](...args);
      log.push(`${op} ${show(args)} -> ${show(value)}`);
      return value;
    } catch (e) {
      log.push(`${op} ${show(args)} !! ${e.message}`);
      throw e;
    }
  };
  const store = {
    inner,
    get: (...args) => call('get', args),
    insert: (...args) => call('insert', args),
    replace: (...args) => call('replace', args),
    delete: (...args) => call('delete', args),
  };
  if (!async) return store;
  const later =
    (op) =>
    async (...args) => {
      await new Promise((resolve) => setImmediate(resolve));
      return call(op, args);
    };
  return { inner, async: true, get: later('get'), insert: later('insert'), replace: later('replace'), delete: later('delete') };
}

/** The same script of calls on a guard; each step's result (or error) as text. */
async function script(guard, clock, store) {
  const out = [];
  const step = async (name, call) => {
    try {
      out.push(`${name}: ${show(await call())}`);
    } catch (e) {
      out.push(`${name}: ${e.name} ${e.kind} ${e.detail ?? e.message}`);
    }
  };
  let claim;
  await step('begin new', async () => {
    const d = await guard.begin('k', 'fp');
    claim = d.val;
    return d;
  });
  await step('begin again', () => guard.begin('k', 'fp'));
  await step('begin other fingerprint', () => guard.begin('k', 'other'));
  clock.advance(100);
  await step('renew', async () => (claim = await guard.renew(claim)));
  await step('checkpoint', async () => (claim = await guard.saveCheckpoint(claim, { phase: 'charged', data: 'ch-1' })));
  // A lost reply: the write applied, its answer lost; the read-back finds it and the call succeeds.
  store.inner.fault('replace', { kind: 'lost', count: 1 });
  await step('renew, reply lost', async () => (claim = await guard.renew(claim)));
  await step('complete', () => guard.complete(claim, { status: 201, headers: [['a', 'b']], body: 'paid' }));
  await step('begin replays', () => guard.begin('k', 'fp'));
  await step('begin 2', async () => {
    const d = await guard.begin('k2', 'fp');
    claim = d.val;
    return d;
  });
  await step('release', () => guard.release(claim));
  clock.advance(5_000);
  await step('takeover', () => guard.begin('k2', 'fp'));
  store.inner.fault('insert', { kind: 'error', message: 'down', count: 1 });
  await step('begin, store down', () => guard.begin('k3', 'fp'));
  await step('begin request', () => guard.beginRequest('k4', { method: 'POST', path: '/x', body: '{}' }));
  return out;
}

function pair(async) {
  const log = [];
  const clock = new ManualClock(1_000_000);
  const store = recording(log, async);
  const guard = Guard.load({ store, clock, random: new Counter(), leaseMs: 1_000, retentionMs: 60_000, renewLease: false });
  return { log, clock, store, guard };
}

test('an asynchronous store sees each primitive once, in the order and with the arguments of a synchronous run', async () => {
  const sync = pair(false);
  const async = pair(true);
  assert.equal(sync.guard.async, false);
  assert.equal(async.guard.async, true);
  const expected = await script(sync.guard, sync.clock, sync.store);
  const got = await script(async.guard, async.clock, async.store);
  assert.deepEqual(got, expected);
  assert.deepEqual(async.log, sync.log);
  // The script did reach the store for every kind of call, the read-back after the lost reply included.
  assert.ok(
    sync.log.some((l) => l.startsWith('get ')),
    sync.log.join('\n'),
  );
  assert.ok(sync.log.length >= 10);
});

test('run over an asynchronous store: the handler runs once, the repeat replays the same bytes', async () => {
  const { guard, log } = pair(true);
  let runs = 0;
  const handler = async (fence, attempt) => {
    runs += 1;
    await attempt.saveCheckpoint('charged', 'ch-1');
    return { status: 201, body: `fence ${fence}` };
  };
  const first = await guard.run('order', 'fp', handler);
  const again = await guard.run('order', 'fp', handler);
  assert.equal(runs, 1);
  assert.equal(first.outcome, 'executed');
  assert.equal(again.outcome, 'replayed');
  assert.deepEqual(again.response, first.response);
  assert.deepEqual(
    log.map((l) => l.split(' ')[0]),
    ['insert', 'replace', 'replace', 'insert'],
  );
});

test('each run is handed a journaled response anew, keeps no handle past the run, and a replay is the store’s own response', async () => {
  const memory = new MemoryStore();
  const read = []; // the responses the store answered with
  const note = (entry) => {
    if (entry?.record.response) read.push(entry.record.response);
    return entry;
  };
  const store = {
    async: true,
    get: async (...args) => note(memory.get(...args)),
    async insert(...args) {
      const outcome = memory.insert(...args);
      if (outcome.tag === 'existing') note(outcome.val);
      return outcome;
    },
    replace: async (...args) => memory.replace(...args),
  };
  // The guard's binding, noting each run of an export and the handles its instance holds after it.
  const runs = [];
  const binding = Guest.load(component);
  const guest = {
    instantiate(...args) {
      const instance = binding.instantiate(...args);
      const noted =
        (name) =>
        (...call) => {
          try {
            return instance[name](...call);
          } finally {
            runs.push(`${name} ${instance.handles}`);
          }
        };
      const names = ['begin', 'complete', 'release', 'renew', 'saveCheckpoint', 'fingerprint', 'beginRequest'];
      return Object.fromEntries(names.map((name) => [name, noted(name)]));
    },
  };
  const guard = Guard.load({ store, guest, clock: new ManualClock(1_000), renewLease: false });
  const response = {
    status: 201,
    headers: [
      ['x-a', '1'],
      ['x-b', Uint8Array.of(0xff)],
    ],
    body: 'paid',
  };

  // A lost reply: runs for the replace, the read-back, then the answer; the read-back's
  // response and complete's are each handed to a run anew, and compared (same-as).
  const claim = (await guard.begin('k', 'fp')).val;
  memory.fault('replace', { kind: 'lost', count: 1 });
  runs.length = 0;
  await guard.complete(claim, response);
  assert.deepEqual(runs, ['complete 0', 'complete 0', 'complete 0']);
  assert.equal(read.length, 1, 'the read-back, read once');

  runs.length = 0;
  const replay = await guard.begin('k', 'fp');
  assert.deepEqual(runs, ['begin 0', 'begin 0']);
  assert.equal(replay.tag, 'replay');
  assert.equal(replay.val, read.at(-1), 'the response the store answered with, itself');
  assert.deepEqual(replay.val, {
    status: 201,
    headers: [
      ['x-a', Uint8Array.of(0x31)],
      ['x-b', Uint8Array.of(0xff)],
    ],
    body: Uint8Array.of(0x70, 0x61, 0x69, 0x64),
  });
});

test('a store failure or a lost reply part-way through a call fails closed', async () => {
  const clock = new ManualClock(1_000_000);
  const memory = new MemoryStore();
  const store = new FaultyStore(memory);
  const guard = Guard.load({ store, clock, random: new Counter(), leaseMs: 1_000, renewLease: false });
  let runs = 0;
  const handler = () => {
    runs += 1;
    return { status: 200, body: 'ok' };
  };

  store.fault('insert', { kind: 'error', message: 'connection refused', count: 1 });
  const down = await guard.run('a', 'fp', handler);
  assert.deepEqual([down.outcome, runs], ['unavailable', 0]);
  assert.match(down.message, /connection refused/);

  // The claim applied, its reply lost: nothing runs now, and the key is in flight until its lease ends.
  store.fault('insert', { kind: 'lost', count: 1 });
  assert.equal((await guard.run('b', 'fp', handler)).outcome, 'unavailable');
  assert.equal((await guard.run('b', 'fp', handler)).outcome, 'in-flight');
  assert.equal(runs, 0);

  // The completion's write lost and its read-back failing too: not recorded, the key stays claimed.
  const d = await guard.begin('c', 'fp');
  store.fault('replace', { kind: 'error', count: 1 });
  store.fault('get', { kind: 'error', count: 1 });
  await assert.rejects(guard.complete(d.val, { status: 200 }), (e) => e instanceof GuardError && e.kind === 'unavailable');
  assert.equal(memory.peek('c', clock.nowMs()).record.state, 'processing');
  assert.deepEqual(store.calls.slice(-3), ['insert c', 'replace c', 'get c']);

  // A host bug in the store (not a StoreError) traps the instance: the call fails closed and the instance is replaced.
  const buggy = Guard.load({
    store: { async: true, get: async () => undefined, insert: async () => Promise.reject(new TypeError('bug')), replace: async () => false },
    clock,
    renewLease: false,
  });
  await assert.rejects(buggy.begin('k', 'fp'), (e) => e instanceof GuardError && e.kind === 'unavailable' && /bug/.test(e.detail));
  assert.equal(buggy.replaced, 1);
});

/**
 * `begin` through a stand-in binding whose run number `run` reads the key
 * `readOn(run)` (nothing when undefined) and answers `conflict`, over an
 * asynchronous store that answers every `get` with nothing and allows no
 * write: it must fail closed as a diverged replay whose detail matches
 * `detail`. Resolves to the keys the store was asked for.
 */
async function beginDiverges(readOn, detail) {
  let run = 0;
  const guest = {
    instantiate(store) {
      return {
        begin() {
          run += 1;
          const key = readOn(run);
          if (key !== undefined) store.get(key, 0n); // the journal answers an unread call with a StoreFailure: no throw
          return { tag: 'conflict' };
        },
      };
    },
  };
  const calls = [];
  const store = {
    async: true,
    async get(key) {
      calls.push(key);
      return undefined;
    },
    insert: async () => assert.fail('no insert'),
    replace: async () => assert.fail('no replace'),
  };
  const guard = Guard.load({ store, guest, clock: new ManualClock(1_000), renewLease: false });
  await assert.rejects(guard.begin('k', 'fp'), (e) => {
    assert.ok(e instanceof GuardError, String(e));
    assert.equal(e.kind, 'unavailable');
    assert.match(e.detail, detail);
    return true;
  });
  return calls;
}

test('a guest that asks for something else on a replay fails closed, and the store sees nothing more', async () => {
  // What a guest keeping state between calls would do: another key on every run.
  const calls = await beginDiverges((run) => `key-${run}`, /replay diverged: the guest asked for get\("key-2"\) where the journal holds get\("key-1"\)/);
  assert.deepEqual(calls, ['key-1']);
});

test('a guest that returns on a replay before reading every recorded answer fails closed', async () => {
  // A read on the first run only.
  const calls = await beginDiverges((run) => (run === 1 ? 'key' : undefined), /replay diverged: the guest returned after 0 of the journal's 1 answers/);
  assert.deepEqual(calls, ['key']);
});

test('a StoreError an asynchronous store rejects with reaches the guard as store-error', async () => {
  const store = {
    async: true,
    get: async () => undefined,
    insert: async () => {
      throw new StoreError('corrupt', 'the record for key "k" does not decode');
    },
    replace: async () => false,
  };
  const guard = Guard.load({ store, clock: new ManualClock(1_000), renewLease: false });
  await assert.rejects(guard.begin('k', 'fp'), (e) => e instanceof GuardError && e.kind === 'unavailable' && /does not decode/.test(e.detail));
  assert.equal(guard.replaced, 0);
});

for (const [name, env, open] of [
  ['Redis', 'IDEM_TEST_REDIS_URL', redisStore],
  ['PostgreSQL', 'IDEM_TEST_POSTGRES_URL', postgresStore],
]) {
  test(`20 concurrent runs of one key on ${name}: the handler runs once, the others are in flight or replayed`, { skip: skipWithout(env) }, async () => {
    const store = await open();
    try {
      const guard = Guard.load({ store, leaseMs: 30_000 });
      const n = 20;
      let executions = 0;
      let settled = 0;
      // The handler finishes once every other run has its answer (or, were there a second execution, every run but those).
      let open;
      const gate = new Promise((resolve) => (open = resolve));
      const check = () => settled + executions === n && open();
      const handler = async (fence) => {
        executions += 1;
        check();
        await gate;
        return { status: 201, body: `fence ${fence}` };
      };
      const runs = Array.from({ length: n }, () =>
        guard.run('same-key', 'fp', handler).then((r) => {
          if (r.outcome !== 'executed') {
            settled += 1;
            check();
          }
          return r;
        }),
      );
      const results = await Promise.all(runs);
      const outcomes = results.map((r) => r.outcome);
      assert.equal(executions, 1, outcomes.join(' '));
      assert.equal(outcomes.filter((o) => o === 'executed').length, 1);
      assert.ok(
        outcomes.every((o) => ['executed', 'in-flight', 'replayed'].includes(o)),
        outcomes.join(' '),
      );
      const again = await guard.run('same-key', 'fp', handler);
      assert.equal(again.outcome, 'replayed');
      assert.deepEqual(again.response, results.find((r) => r.outcome === 'executed').response);
    } finally {
      await store.cleanUp();
    }
  });
}

test('run over an asynchronous store renews the lease while the handler runs, one write of the claim at a time', async () => {
  const memory = new MemoryStore();
  const writes = [];
  let inFlight = 0;
  let overlapped = false;
  let renewed;
  const twoRenewals = new Promise((resolve) => (renewed = resolve));
  const store = {
    async: true,
    clock: memory.clock,
    get: async (...args) => memory.get(...args),
    insert: async (...args) => memory.insert(...args),
    async replace(key, expected, record, now) {
      overlapped ||= inFlight > 0;
      inFlight += 1;
      await new Promise((resolve) => setImmediate(resolve));
      inFlight -= 1;
      writes.push(record.state);
      if (writes.length === 2) renewed();
      return memory.replace(key, expected, record, now);
    },
  };
  // A 60 ms lease: renewed every 20 ms while the handler waits for two renewals.
  const guard = Guard.load({ store, leaseMs: 60 });
  // The renewal timer is unref'd (it never keeps a process alive): a server's sockets would; here this does.
  const alive = setInterval(() => {}, 1_000);
  const result = await guard
    .run('slow', 'fp', async (fence, attempt) => {
      await twoRenewals;
      const claim = await attempt.saveCheckpoint('charged', 'ch-1');
      assert.ok(claim.fence > fence);
      return { status: 200, body: 'done' };
    })
    .finally(() => clearInterval(alive));
  assert.equal(result.outcome, 'executed');
  assert.equal(overlapped, false, 'two writes of one claim overlapped');
  // Two renewals (or more), the checkpoint, then the completion from the latest claim.
  assert.ok(writes.length >= 4, writes.join(' '));
  assert.equal(writes.at(-1), 'done');
  const entry = memory.peek('slow', memory.clock.nowMs());
  assert.equal(entry.record.state, 'done');
  assert.equal(entry.version, BigInt(writes.length + 1));
});
