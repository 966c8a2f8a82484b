// What `run` does with what a handler returned, and what a guard tells its
// logger and its `onDecision` callback (issue #46): a value it cannot store
// never runs the handler again; every run is reported once, with the
// store's words for the operator and none for the client; a MemoryStore in a
// node:cluster worker is warned about (Guard) and refused (Express).

import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { Guard, GuardError, ManualClock, MemoryStore, NotRecordedError, processLocal } from '../index.js';
import { asyncOver } from '../testing/async-store.js';

/** A logger that keeps what it is told. */
function recorder() {
  const lines = [];
  const at = (level) => (message, fields) => lines.push({ level, message, fields });
  return { lines, logger: { debug: at('debug'), info: at('info'), warn: at('warn'), error: at('error') } };
}

const UNSTORABLE = [
  ['an object that is no response', () => ({ at: new Date(0), total: 10n })],
  ['a body that is neither a string nor bytes', () => ({ status: 200, body: { at: new Date(0) } })],
  ['a header value that is a number', () => ({ status: 200, headers: [['x-n', 7]], body: 'ok' })],
  ['nothing at all', () => undefined],
  ['a response over maxResponseBytes', () => ({ status: 200, body: 'x'.repeat(65) })],
];

for (const flavour of ['MemoryStore', 'an asynchronous store']) {
  for (const [what, returned] of UNSTORABLE) {
    test(`over ${flavour}, a handler that returns ${what} ran once: the key is kept, not released, and a repeat is in flight`, async () => {
      const clock = new ManualClock(1_000_000);
      const memory = new MemoryStore();
      const store = flavour === 'MemoryStore' ? memory : asyncOver(memory);
      const guard = Guard.load({ store, clock, leaseMs: 1_000, retentionMs: 60_000, maxResponseBytes: 64, renewLease: false });
      let effects = 0;
      const handler = async () => {
        effects += 1; // the side effect: a charge
        return returned();
      };
      await assert.rejects(guard.run('k', 'fp', handler), (e) => {
        assert.ok(e instanceof NotRecordedError, `${e}`);
        assert.ok(e.error instanceof GuardError && e.error.kind === 'invalid-input', `${e.error}`);
        return true;
      });
      assert.equal(effects, 1);
      // Not released: the record is still the claim, and a repeat waits for its lease.
      assert.equal(memory.peek('k', clock.nowMs()).record.state, 'processing');
      assert.deepEqual(await guard.run('k', 'fp', handler), { outcome: 'in-flight', retryAfterMs: 1_000 });
      assert.equal(effects, 1);
    });
  }
}

test('what a non-response handler returned is on the error, and the message says what is wrong with it', async () => {
  const guard = Guard.load({ store: new MemoryStore(), clock: new ManualClock(1_000) });
  const value = { at: new Date(0) };
  const error = await guard
    .run('k', 'fp', async () => value)
    .then(
      () => assert.fail('resolved'),
      (e) => e,
    );
  assert.equal(error.value, value);
  assert.equal(error.response, undefined);
  assert.match(error.message, /the handler returned an object without a numeric status, not a response/);
});

test('a handler that throws still releases its key: the retry runs', async () => {
  const guard = Guard.load({ store: new MemoryStore(), clock: new ManualClock(1_000) });
  let effects = 0;
  await assert.rejects(
    guard.run('k', 'fp', async () => {
      effects += 1;
      throw new Error('card declined before charging');
    }),
    /card declined/,
  );
  const again = await guard.run('k', 'fp', async () => ({ status: 201, body: `${(effects += 1)}` }));
  assert.equal(again.outcome, 'executed');
  assert.equal(effects, 2);
});

test('onDecision is told every run once, with its outcome, decision, fence and timings; the logger says what went wrong', async () => {
  const clock = new ManualClock(1_000_000);
  const store = new MemoryStore();
  const events = [];
  const { lines, logger } = recorder();
  const guard = Guard.load({ store, clock, leaseMs: 1_000, logger, onDecision: (e) => events.push(e), renewLease: false });
  const ok = async () => ({ status: 201, body: 'paid' });

  await guard.run('a', 'fp', ok); // executed
  await guard.run('a', 'fp', ok); // replayed
  await guard.run('a', 'other', ok); // conflict
  const held = guard.begin('b', 'fp').val;
  await guard.run('b', 'fp', ok); // in flight
  guard.release(held);
  await assert.rejects(guard.run('c', 'fp', async () => Promise.reject(new Error('boom')))); // failed
  await assert.rejects(guard.run('d', 'fp', async () => 'not a response')); // not recorded
  store.fault('insert', { kind: 'error', message: 'connect ECONNREFUSED 10.1.2.3:6379' });
  assert.equal((await guard.run('e', 'fp', ok)).outcome, 'unavailable');
  store.clearFaults();
  await assert.rejects(guard.run('', 'fp', ok), GuardError); // invalid key

  assert.deepEqual(
    events.map((e) => [e.key, e.outcome, e.decision]),
    [
      ['a', 'executed', 'proceed'],
      ['a', 'replayed', 'replay'],
      ['a', 'conflict', 'conflict'],
      ['b', 'in-flight', 'in-flight'],
      ['c', 'failed', 'proceed'],
      ['d', 'not-recorded', 'proceed'],
      ['e', 'unavailable', undefined],
      ['', 'invalid-input', undefined],
    ],
  );
  assert.equal(events[0].fence, 1n);
  assert.equal(events[1].fence, undefined);
  for (const e of events) assert.ok(e.ms >= 0 && Number.isFinite(e.ms), `${e.key} ${e.ms}`);
  assert.ok(events[0].handlerMs >= 0 && events[0].handlerMs <= events[0].ms);
  assert.equal(events[3].retryAfterMs, 1_000);
  assert.equal(events[6].reason.includes('ECONNREFUSED 10.1.2.3:6379'), true, 'the operator is told the store error');

  const at = (level) => lines.filter((l) => l.level === level).map((l) => l.fields.key);
  assert.deepEqual(at('warn'), ['e']);
  assert.deepEqual(at('error'), ['d']);
  assert.deepEqual(at('info'), ['c']);
  assert.deepEqual(at('debug'), ['a', 'a', 'a', 'b', '']);
  assert.match(lines.find((l) => l.level === 'warn').message, /did not answer for e; nothing ran/);
  assert.match(lines.find((l) => l.level === 'warn').fields.reason, /ECONNREFUSED/);
});

test('over an asynchronous store the events are the same', async () => {
  const events = [];
  const guard = Guard.load({ store: asyncOver(new MemoryStore()), clock: new ManualClock(1_000), onDecision: (e) => events.push(e) });
  await guard.run('k', 'fp', async () => ({ status: 200, body: 'x' }));
  await guard.run('k', 'fp', async () => ({ status: 200, body: 'x' }));
  assert.deepEqual(
    events.map((e) => [e.outcome, e.decision, e.fence]),
    [
      ['executed', 'proceed', 1n],
      ['replayed', 'replay', undefined],
    ],
  );
});

test('a logger or onDecision that throws changes nothing: the run, its response and the next run are as without them', async () => {
  const boom = () => {
    throw new Error('hook failed');
  };
  const guard = Guard.load({ store: new MemoryStore(), clock: new ManualClock(1_000), logger: { debug: boom, warn: boom }, onDecision: boom });
  let effects = 0;
  const handler = async () => ({ status: 201, body: `run ${(effects += 1)}` });
  const first = await guard.run('k', 'fp', handler);
  const again = await guard.run('k', 'fp', handler);
  assert.deepEqual([first.outcome, again.outcome, effects], ['executed', 'replayed', 1]);
  assert.deepEqual(again.response.body, first.response.body);
});

test('bad hooks are refused at load, naming the option', () => {
  assert.throws(() => Guard.load({ onDecision: 'metrics' }), /onDecision: expected a function/);
  assert.throws(() => Guard.load({ logger: {} }), /logger: expected at least one of debug, info, warn, error/);
});

test('renewal failures are logged: the operator learns that a lease could not be extended', async () => {
  const store = new MemoryStore();
  const { lines, logger } = recorder();
  const guard = Guard.load({ store, leaseMs: 90, logger });
  let release;
  const running = guard.run('slow', 'fp', () => new Promise((resolve) => (release = resolve)));
  store.fault('replace', { kind: 'error', message: 'replica is read-only' });
  // Poll for the warning (the renewal timer fires every third of the lease), with a generous deadline.
  const deadline = Date.now() + 30_000;
  while (!lines.some((l) => l.level === 'warn') && Date.now() < deadline) await new Promise((r) => setTimeout(r, 5));
  store.clearFaults();
  release({ status: 200, body: 'done' });
  await running;
  const warning = lines.find((l) => l.level === 'warn');
  assert.ok(warning, 'no warning logged');
  assert.match(warning.message, /renewing the lease of slow failed; trying again/);
  assert.match(warning.fields.reason, /read-only/);
});

test('processLocal names the stores a cluster worker cannot share', () => {
  assert.equal(processLocal(new MemoryStore()), true);
  assert.equal(processLocal({ async: true, get() {}, insert() {}, replace() {} }), false);
  assert.equal(processLocal({ processLocal: true, get() {}, insert() {}, replace() {} }), true);
});

test('in a node:cluster worker, a Guard over MemoryStore warns and the Express middleware refuses it; a shared store is accepted', () => {
  // A primary that forks one worker; the worker reports what happened as JSON on stdout.
  const index = pathToFileURL(fileURLToPath(new URL('../index.js', import.meta.url))).href;
  const express = pathToFileURL(fileURLToPath(new URL('../express.js', import.meta.url))).href;
  const program = `
    import cluster from 'node:cluster';
    if (cluster.isPrimary) {
      cluster.fork().on('exit', (code) => process.exit(code));
    } else {
      const { Guard, MemoryStore } = await import(${JSON.stringify(index)});
      const { idempotency } = await import(${JSON.stringify(express)});
      const warnings = [];
      process.on('warning', (w) => warnings.push(w.code));
      const guard = Guard.load({ store: new MemoryStore() });
      let refused = null;
      try { idempotency({ guard }); } catch (e) { refused = e.message; }
      const allowed = typeof idempotency({ guard, allowProcessLocalStore: true });
      const shared = { async: true, clock: { nowMs: () => 0n }, get: async () => undefined, insert: async () => ({ tag: 'inserted', val: 1n }), replace: async () => false };
      const onShared = typeof idempotency({ guard: Guard.load({ store: shared }) });
      await new Promise((r) => setImmediate(r)); // warnings are emitted on the next tick
      console.log(JSON.stringify({ warnings, refused, allowed, onShared }));
      process.exit(0);
    }`;
  const dir = mkdtempSync(join(tmpdir(), 'idem-cluster-'));
  let out;
  try {
    writeFileSync(join(dir, 'cluster.mjs'), program); // a file: cluster.fork() runs the worker from it
    out = JSON.parse(execFileSync(process.execPath, [join(dir, 'cluster.mjs')], { encoding: 'utf8' }));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  assert.deepEqual(out.warnings, ['IDEM_PROCESS_LOCAL_STORE']);
  assert.match(out.refused, /MemoryStore.*node:cluster workers.*Use a shared store/);
  assert.deepEqual([out.allowed, out.onShared], ['function', 'function']);
});
