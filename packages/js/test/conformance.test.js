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
import { bytes, checkpointJson, Failure, files, load, mutants, play, response, responseJson, text } from '../testing/scenarios.js';

function errorJson(e) {
  if (e instanceof GuardError) return { error: e.kind, message: e.detail };
  throw e;
}

/** What `call` returns (or resolves to: an asynchronous guard's calls return Promises), its `GuardError` thrown as the runner's `Failure`. */
async function guarded(call) {
  try {
    return await call();
  } catch (e) {
    if (e instanceof GuardError) throw new Failure(e.kind, e.detail);
    throw e;
  }
}

const guests = { abi: undefined, jco: await jcoGuest() };

/** A `Guard` as testing/scenarios.js drives a host, answering `run` steps with `guard.run` itself. */
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
  }

  begin(key, fingerprint) {
    return guarded(() => this.guard.begin(key, fingerprint));
  }

  complete(claim, response) {
    return guarded(() => this.guard.complete(claim, response));
  }

  release(claim) {
    return guarded(() => this.guard.release(claim));
  }

  renew(claim) {
    return guarded(() => this.guard.renew(claim));
  }

  saveCheckpoint(claim, checkpoint) {
    return guarded(() => this.guard.saveCheckpoint(claim, checkpoint));
  }

  fingerprint(parts) {
    return guarded(() => this.guard.fingerprint(parts));
  }

  setFault(primitive, rule) {
    this.store.fault(primitive, rule);
  }

  clearFaults() {
    this.store.clearFaults();
  }

  peek(key) {
    return this.store instanceof FaultyStore ? this.store.inner.get(key, this.clock.nowMs()) : this.store.peek(key, this.clock.nowMs());
  }

  /** `guard.run` with a handler that counts its side effect in `effects` and saves the step's checkpoints. */
  async run(step, effects) {
    const name = step.effect ?? 'effect';
    let resumed;
    const handler = async (_fence, attempt) => {
      resumed = checkpointJson(attempt.checkpoint);
      effects.set(name, (effects.get(name) ?? 0) + 1);
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

/** Plays a scenario (testing/scenarios.js); returns the number of checked steps, or throws `step N (op): ...`. */
function runScenario(scenario, guest = guests.abi, store = undefined) {
  return play(scenario, new Host(scenario, guest, store));
}

/** The scenario failed its check at step `i` (`play` names the step of an error thrown there too: that one has a `cause`). */
const mismatchAt = (e, i) => e.message.startsWith(`step ${i} `) && e.cause === undefined;

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
    const broken = mutants(load(file));
    for (const [i, mutant] of broken) {
      await assert.rejects(runScenario(mutant), (e) => mismatchAt(e, i), `${file}: step ${i} mutated`);
    }
    assert.ok(broken.length > 0, `${file}: no step could be broken`);
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
      await assert.rejects(runScenario(plain), (e) => mismatchAt(e, i), `${file}: step ${i} without its \`with\``);
      dropped += 1;
    }
  }
  assert.ok(dropped >= 5, `${dropped} steps carry \`with\``);
});
