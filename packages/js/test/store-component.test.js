// A store is a component: the guard composed with the reference store
// component (examples/store-component, composed by scripts/compose-store.sh
// with wac), hosted in Node.js through jco's transpiled glue as a third party
// would host it. The host gives it only `clock`, `random` and the `response`
// resource (world idem:guard/idem-with-store); records and response bytes
// live in the instance's memory, so each scenario gets an instance of its own.
//
// Every conformance scenario runs on the tests' composition (which also
// exports the store's `testing` hooks, for `fault` and `peek` steps); those
// without faults, their peeks left out, on `wac plug`'s output itself; every
// one too on @idem/guard (its own binding) with the store component alone as
// its store, the workaround for jco's cost (docs/src/polyglot.md, "A store written as a
// component"); and breaking any one expectation fails its scenario at that
// step.
//
// The compositions come from IDEM_STORE_COMPONENTS or scripts/compose-store.sh,
// transpiled with the pinned jco (testing/store-component.js).

import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Guard, GuardError, ManualClock } from '../index.js';
import { Failure, files, load, mutants, play } from '../testing/scenarios.js';
import { componentStore, decision, guarded, imports, PLUGGED, Response, TESTING, transpile } from '../testing/store-component.js';

const compositions = { testing: await transpile(TESTING), plugged: await transpile(PLUGGED) };

const fail = (kind, detail) => new Failure(kind, detail);

/** One instance of a composition, as testing/scenarios.js drives a host. */
class ComposedHost {
  constructor(scenario, instantiate) {
    let now = scenario.clock_ms;
    this.clock = {
      set: (ms) => {
        now = ms;
      },
      advance: (ms) => {
        now += ms;
      },
      nowMs: () => BigInt(now),
    };
    const exports = instantiate(imports({ nowMs: this.clock.nowMs }));
    this.guard = exports.guard;
    this.testing = exports.testing;
    const p = scenario.policy;
    this.policy = { leaseMs: BigInt(p.lease_ms), retentionMs: BigInt(p.retention_ms), maxResponseBytes: p.max_response_bytes };
  }

  begin(key, fingerprint) {
    return decision(guarded(() => this.guard.begin(key, fingerprint, this.policy), fail));
  }

  complete(claim, response) {
    const { status, headers, body } = response;
    guarded(() => this.guard.complete(claim, new Response(status, headers, body), this.policy), fail);
  }

  release(claim) {
    guarded(() => this.guard.release(claim), fail);
  }

  renew(claim) {
    return guarded(() => this.guard.renew(claim, this.policy), fail);
  }

  saveCheckpoint(claim, checkpoint) {
    return guarded(() => this.guard.saveCheckpoint(claim, checkpoint, this.policy), fail);
  }

  fingerprint(parts) {
    return this.guard.fingerprint(parts);
  }

  hooks() {
    if (!this.testing) throw new Error('this composition does not export the store');
    return this.testing;
  }

  setFault(primitive, { kind, message, count }) {
    this.hooks().setFault(primitive, kind, message, count);
  }

  clearFaults() {
    this.hooks().clearFaults();
  }

  peek(key) {
    const entry = this.hooks().peek(key, this.clock.nowMs());
    if (!entry) return null;
    return { record: { ...entry.record, response: entry.response?.response }, version: entry.version };
  }
}

/** The scenario as `wac plug`'s composition can take it (no faults; its peeks, which only read, left out), or null. */
function withoutHooks(scenario) {
  if (scenario.steps.some((s) => s.op === 'fault' || s.op === 'clear_faults')) return null;
  return { ...scenario, steps: scenario.steps.filter((s) => s.op !== 'peek') };
}

/**
 * @idem/guard (its own binding) over the store component alone as its store
 * (componentStore: only the store calls go through jco's glue), as
 * testing/scenarios.js drives a host.
 */
class PackageHost {
  static async open(scenario) {
    return new PackageHost(scenario, await componentStore());
  }

  constructor(scenario, store) {
    this.clock = new ManualClock(scenario.clock_ms);
    this.store = store;
    const p = scenario.policy;
    this.guard = Guard.load({ store, clock: this.clock, leaseMs: p.lease_ms, retentionMs: p.retention_ms, maxResponseBytes: p.max_response_bytes });
  }

  #call(call) {
    try {
      return call();
    } catch (e) {
      if (e instanceof GuardError) throw new Failure(e.kind, e.detail);
      throw e;
    }
  }

  begin(key, fingerprint) {
    return this.#call(() => this.guard.begin(key, fingerprint));
  }
  complete(claim, response) {
    this.#call(() => this.guard.complete(claim, response));
  }
  release(claim) {
    this.#call(() => this.guard.release(claim));
  }
  renew(claim) {
    return this.#call(() => this.guard.renew(claim));
  }
  saveCheckpoint(claim, checkpoint) {
    return this.#call(() => this.guard.saveCheckpoint(claim, checkpoint));
  }
  fingerprint(parts) {
    return this.guard.fingerprint(parts);
  }
  setFault(primitive, rule) {
    this.store.fault(primitive, rule);
  }
  clearFaults() {
    this.store.clearFaults();
  }
  peek(key) {
    return this.store.peek(key, this.clock.nowMs());
  }
}

test('the conformance suite is all there', () => {
  assert.ok(files.length >= 20, `found ${files.length} scenario files`);
});

for (const file of files) {
  test(`conformance (store component, jco): ${file}`, async () => {
    const scenario = load(file);
    const checked = await play(scenario, new ComposedHost(scenario, compositions.testing));
    assert.ok(checked > 0);
  });
}

for (const file of files) {
  test(`conformance (@idem/guard over the store component): ${file}`, async () => {
    const scenario = load(file);
    const checked = await play(scenario, await PackageHost.open(scenario));
    assert.ok(checked > 0);
  });
}

test("wac plug's composition links with clock, random and types alone and exports the guard alone", () => {
  const host = new ComposedHost(load(files[0]), compositions.plugged);
  assert.equal(typeof host.guard.begin, 'function');
  assert.equal(host.testing, undefined);
});

const plugged = files.map((file) => [file, withoutHooks(load(file))]).filter(([, scenario]) => scenario);
test('most scenarios run on the plugged composition', () => {
  assert.ok(plugged.length >= 15, `only ${plugged.length}`);
});
for (const [file, scenario] of plugged) {
  test(`conformance (wac plug, jco): ${file}`, async () => {
    const checked = await play(scenario, new ComposedHost(scenario, compositions.plugged));
    assert.ok(checked > 0);
  });
}

// The runner must be able to fail: breaking one expectation fails the scenario at that step.
for (const file of files) {
  test(`a wrong expectation fails the scenario at that step (store component): ${file}`, async () => {
    const broken = mutants(load(file));
    for (const [i, mutant] of broken) {
      await assert.rejects(
        play(mutant, new ComposedHost(mutant, compositions.testing)),
        (e) => e.message.startsWith(`step ${i} `),
        `${file}: step ${i} mutated`,
      );
    }
    assert.ok(broken.length > 0, `${file}: no step could be broken`);
  });
}
