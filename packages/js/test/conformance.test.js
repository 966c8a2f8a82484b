// Every conformance scenario (conformance/*.json, format in
// conformance/README.md) against the component hosted in Node.js, with a
// ManualClock: on the JavaScript MemoryStore through both bindings
// (idem-abi.js, the guard's, and jco's glue, the reference it is checked
// against), and on RedisStore and PostgresStore (each scenario under a key
// prefix of its own, or on an emptied table of this run's own), where the
// guard replays each call from a journal. The Rust and Python hosts run the
// same files. The Redis and PostgreSQL runs need IDEM_TEST_REDIS_URL and
// IDEM_TEST_POSTGRES_URL, and fail without them unless
// IDEM_TEST_SKIP_NETSTORES=1 (testing/netstores.js).

import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { Guard, GuardError, ManualClock, MemoryStore, NotRecordedError } from '../index.js';
import { jcoGuest } from '../jco-guest.js';
import { dynamodbStore, FaultyStore, postgresStore, redisStore, skipWithout } from '../testing/netstores.js';
import { bytes, check, checkpointJson, claimJson, decisionJson, files, load, mutate, response, responseJson, show, text } from '../testing/scenarios.js';

function errorJson(e) {
  if (e instanceof GuardError) return { error: e.kind, message: e.detail };
  throw e;
}

/** `ok` of what `call` returns (or resolves to: an asynchronous guard's calls return Promises), else the error as JSON. */
async function attempt(call, ok) {
  try {
    return ok(await call());
  } catch (e) {
    return errorJson(e);
  }
}

const guests = { abi: undefined, jco: await jcoGuest() };

class Host {
  /** `store`: a MemoryStore (the default), or a FaultyStore in front of a network store. */
  constructor(scenario, guest, store = new MemoryStore()) {
    this.clock = new ManualClock(scenario.clock_ms);
    this.store = store;
    const p = scenario.policy;
    this.guard = Guard.load({
      store: this.store,
      clock: this.clock,
      leaseMs: p.lease_ms,
      retentionMs: p.retention_ms,
      maxResponseBytes: p.max_response_bytes,
      guest,
    });
    this.claims = new Map();
    this.effects = new Map();
  }

  /** The named claim, with the fields of the step's `with` (u64s as decimal strings) replaced for this call. */
  claim(step) {
    const claim = this.claims.get(step.claim);
    if (!claim) throw new Error(`no claim named ${step.claim}`);
    if (step.with === undefined) return claim;
    const altered = { ...claim };
    for (const [field, value] of Object.entries(step.with)) {
      if (field !== 'holder' && field !== 'fence') throw new Error(`\`with\` replaces holder or fence, not ${JSON.stringify(field)}`);
      if (typeof value !== 'string' || !/^[0-9]+$/.test(value))
        throw new Error(`\`with\`.${field} must be a u64 as a decimal string, got ${JSON.stringify(value)}`);
      altered[field] = BigInt(value);
    }
    return altered;
  }

  async step(step) {
    const g = this.guard;
    switch (step.op) {
      case 'clock':
        if (step.set_ms !== undefined) this.clock.set(step.set_ms);
        else if (step.advance_ms !== undefined) this.clock.advance(step.advance_ms);
        else throw new Error('clock needs set_ms or advance_ms');
        return null;
      case 'fault':
        if (!['error', 'lost'].includes(step.kind)) throw new Error(`unknown fault kind ${step.kind}`);
        this.store.fault(step.primitive, { kind: step.kind, message: step.message, count: step.count });
        return null;
      case 'clear_faults':
        this.store.clearFaults();
        return null;
      case 'begin':
        return attempt(
          () => g.begin(text(step.key), text(step.fingerprint)),
          (d) => {
            if (d.tag === 'proceed' && step.as) this.claims.set(step.as, d.val);
            return decisionJson(d);
          },
        );
      case 'complete':
        return attempt(
          () => g.complete(this.claim(step), response(step.response)),
          () => ({ ok: true }),
        );
      case 'release':
        return attempt(
          () => g.release(this.claim(step)),
          () => ({ ok: true }),
        );
      case 'renew':
        return attempt(
          () => g.renew(this.claim(step)),
          (c) => {
            if (step.as) this.claims.set(step.as, c);
            return { ok: true, ...claimJson(c) };
          },
        );
      case 'checkpoint':
        return attempt(
          () => g.saveCheckpoint(this.claim(step), { phase: text(step.phase), data: bytes(step.data) }),
          (c) => {
            if (step.as) this.claims.set(step.as, c);
            return { ok: true, ...claimJson(c) };
          },
        );
      case 'run':
        return this.run(step);
      case 'effects':
        return Object.fromEntries(Object.keys(step.expect).map((name) => [name, this.effects.get(name) ?? 0]));
      case 'peek': {
        const key = text(step.key);
        const entry = this.store instanceof FaultyStore ? await this.store.inner.get(key, this.clock.nowMs()) : this.store.peek(key, this.clock.nowMs());
        if (!entry) return { absent: true };
        const r = entry.record;
        return {
          absent: false,
          state: r.state,
          version: Number(entry.version),
          fingerprint: r.fingerprint,
          holder: r.holder,
          lease_until_ms: Number(r.leaseUntilMs),
          expires_at_ms: Number(r.expiresAtMs),
          checkpoint: checkpointJson(r.checkpoint),
          ...(r.response ? responseJson(r.response) : {}),
        };
      }
      case 'fingerprint': {
        const q = step.request;
        return attempt(
          () =>
            g.fingerprint({ method: text(q.method), path: text(q.path), headers: (q.headers ?? []).map(([n, v]) => [text(n), bytes(v)]), body: bytes(q.body) }),
          (fingerprint) => ({ fingerprint }),
        );
      }
    }
    throw new Error(`unknown op ${step.op}`);
  }

  /** `guard.run` with a handler that counts its side effect and saves the step's checkpoints. */
  async run(step) {
    const name = step.effect ?? 'effect';
    let resumed;
    const handler = async (_fence, attempt) => {
      resumed = checkpointJson(attempt.checkpoint);
      this.effects.set(name, (this.effects.get(name) ?? 0) + 1);
      for (const c of step.checkpoints ?? []) await attempt.saveCheckpoint(text(c.phase), bytes(c.data));
      if (step.fails) throw new Error('handler failed');
      return response(step.response);
    };
    try {
      const r = await this.guard.run(text(step.key), text(step.fingerprint), handler);
      switch (r.outcome) {
        case 'executed':
          return { outcome: r.outcome, ...responseJson(r.response), resumed };
        case 'replayed':
          return { outcome: r.outcome, ...responseJson(r.response) };
        case 'in-flight':
          return { outcome: 'in-flight', retry_after_ms: r.retryAfterMs };
        case 'unavailable':
          return { outcome: 'unavailable', message: r.message };
        default:
          return { outcome: r.outcome };
      }
    } catch (e) {
      if (e instanceof NotRecordedError) return { outcome: 'not-recorded', ...errorJson(e.error) };
      if (e instanceof GuardError) return errorJson(e);
      if (e.message === 'handler failed') return { outcome: 'handler-failed' };
      throw e;
    }
  }
}

/** Runs a scenario; returns the number of checked steps, or throws `step N (op): ...`. */
async function runScenario(scenario, guest = guests.abi, store = undefined) {
  const host = new Host(scenario, guest, store);
  let checked = 0;
  for (const [i, step] of scenario.steps.entries()) {
    for (let n = 0; n < (step.times ?? 1); n++) {
      const actual = await host.step(step);
      if (actual === null) continue;
      if (!step.expect) throw new Error(`step ${i} (${step.op}): no expect`);
      const why = check(step.expect, actual, host.claims);
      if (why) throw new Error(`step ${i} (${step.op}): ${why}; got ${show(actual)}`);
      checked += 1;
    }
  }
  return checked;
}

test('the conformance suite is all there', () => {
  assert.ok(files.length >= 15, `found ${files.length} scenario files`);
});

for (const file of files) {
  for (const [binding, guest] of Object.entries(guests)) {
    test(`conformance (${binding}): ${file}`, async () => {
      const checked = await runScenario(load(file), guest);
      assert.ok(checked > 0);
    });
  }
}

// The network stores, the guard asynchronous: on Redis each scenario under a
// key prefix of its own; on PostgreSQL one table for the run, emptied before
// each scenario (a scenario's keys are fixed and its bad-input cases go up
// to the key limit, so keys cannot be prefixed there).
let postgres = null;
after(async () => {
  // A store that did not open failed its tests already.
  if (postgres)
    await postgres.then(
      (store) => store.cleanUp(),
      () => {},
    );
});

const netstores = {
  redis: {
    env: 'IDEM_TEST_REDIS_URL',
    open: () => redisStore(),
    done: (store) => store.cleanUp(),
  },
  // Valkey 8.1+: completions are SET … IFEQ, not the script.
  valkey: {
    env: 'IDEM_TEST_VALKEY_URL',
    async open() {
      const store = await redisStore({}, 'IDEM_TEST_VALKEY_URL');
      assert.ok(store.nativeCas, 'Valkey answers SET … IFEQ');
      return store;
    },
    done: (store) => store.cleanUp(),
  },
  postgres: {
    env: 'IDEM_TEST_POSTGRES_URL',
    async open() {
      postgres ??= postgresStore();
      const store = await postgres;
      await store.sql(`DELETE FROM ${store.table}`);
      return store;
    },
    done: async () => {},
  },
  // A table of its own per scenario (created by the store as it opens).
  dynamodb: {
    env: 'IDEM_TEST_DYNAMODB_URL',
    open: () => dynamodbStore(),
    done: (store) => store.cleanUp(),
  },
};

for (const [name, { env, open, done }] of Object.entries(netstores)) {
  for (const file of files) {
    test(`conformance (${name}): ${file}`, { skip: skipWithout(env) }, async () => {
      const store = await open();
      try {
        const checked = await runScenario(load(file), guests.abi, new FaultyStore(store));
        assert.ok(checked > 0);
      } finally {
        await done(store);
      }
    });
  }
}

// One test per file, as the Python runner does: a scenario that fails outright does not hide the others' checks.
for (const file of files) {
  test(`a wrong expectation fails the scenario at that step: ${file}`, async () => {
    const scenario = load(file);
    let broken = 0;
    for (const [i, step] of scenario.steps.entries()) {
      const wrong = mutate(step.expect);
      if (!wrong) continue;
      const mutant = structuredClone(scenario);
      mutant.steps[i].expect = wrong;
      await assert.rejects(runScenario(mutant), (e) => e.message.startsWith(`step ${i} `), `${file}: step ${i} mutated`);
      broken += 1;
    }
    assert.ok(broken > 0, `${file}: no step could be broken`);
  });
}

// `with` is honoured: the same step with the claim passed back as kept gets another answer.
test("a step's `with` changes the claim the guard is given: without it the scenario fails at that step", async () => {
  let dropped = 0;
  for (const file of files) {
    const scenario = load(file);
    for (const [i, step] of scenario.steps.entries()) {
      if (step.with === undefined) continue;
      const plain = structuredClone(scenario);
      delete plain.steps[i].with;
      await assert.rejects(runScenario(plain), (e) => e.message.startsWith(`step ${i} `), `${file}: step ${i} without its \`with\``);
      dropped += 1;
    }
  }
  assert.ok(dropped >= 5, `${dropped} steps carry \`with\``);
});
