// A store is a component: the guard composed with the reference store
// component (examples/store-component, composed by scripts/compose-store.sh
// with wac), hosted in Node.js through jco's transpiled glue as a third party
// would host it. The host gives it only `clock`, `random` and the `response`
// resource (world idem:guard/idem-with-store); records and response bytes
// live in the instance's memory, so each scenario gets an instance of its own.
//
// Every conformance scenario runs on the tests' composition (which also
// exports the store's `testing` hooks, for `fault` and `peek` steps); those
// without faults, their peeks left out, on `wac plug`'s output itself; and
// breaking any one expectation fails its scenario at that step.
//
// The compositions come from IDEM_STORE_COMPONENTS (the directory
// scripts/compose-store.sh wrote; examples/run-polyglot-tests.sh sets it),
// or else from running that script (which needs cargo). Each is transpiled
// here with the pinned jco (`jco transpile --instantiation sync`).

import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { Failure, files, load, mutate, play } from '../testing/scenarios.js';

const root = fileURLToPath(new URL('../../../', import.meta.url));
const components =
  process.env.IDEM_STORE_COMPONENTS ||
  execFileSync('bash', [join(root, 'scripts/compose-store.sh')], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] }).trim();

const scratch = mkdtempSync(join(tmpdir(), 'idem-store-component-'));
after(() => rmSync(scratch, { recursive: true, force: true }));

/** `jco transpile`s `file` and loads its glue; core modules are compiled once. */
async function transpile(file) {
  const out = join(scratch, file.replace(/\.wasm$/, ''));
  const jco = join(root, 'packages/js/node_modules/.bin/jco');
  execFileSync(jco, ['transpile', join(components, file), '-o', out, '--name', 'composed', '--instantiation', 'sync', '--no-wasi-shim', '-q']);
  const { instantiate } = await import(pathToFileURL(join(out, 'composed.js')).href);
  const modules = new Map();
  const coreModule = (name) => {
    if (!modules.has(name)) modules.set(name, new WebAssembly.Module(readFileSync(join(out, name))));
    return modules.get(name);
  };
  return (imports) => instantiate(coreModule, imports);
}

const compositions = {
  testing: await transpile('guard-with-memory-store.wasm'),
  plugged: await transpile('idem-with-memory-store.wasm'),
};

/**
 * The host's `response` resource (wit/types.wit), as jco takes it: a class
 * given as `Response` in `idem:guard/types`. jco calls the constructor when
 * the store makes a response, the methods when the guard or the store calls
 * them, and lowers an instance of this class (only) as a handle.
 */
class Response {
  constructor(status, headers, body) {
    this.response = { status, headers, body };
  }
  status() {
    return this.response.status;
  }
  size() {
    const { headers, body } = this.response;
    return BigInt(headers.reduce((n, [name, value]) => n + Buffer.byteLength(name) + value.length, body.length));
  }
  sameAs(other) {
    const [a, b] = [this.response, other.response];
    const same = (x, y) => Buffer.from(x).equals(Buffer.from(y));
    return (
      a.status === b.status &&
      same(a.body, b.body) &&
      a.headers.length === b.headers.length &&
      a.headers.every(([n, v], i) => n === b.headers[i][0] && same(v, b.headers[i][1]))
    );
  }
  headers() {
    return this.response.headers;
  }
  body() {
    return this.response.body;
  }
}

/** 64 random bits, as `random.random-u64` gives them. */
function randomU64() {
  return crypto.getRandomValues(new BigUint64Array(1))[0];
}

/** A guard error thrown by jco's glue (a `ComponentError` whose `payload` is the guard-error), as a `Failure`. */
function guarded(call) {
  try {
    return call();
  } catch (e) {
    if (e && Object.hasOwn(e, 'payload') && typeof e.payload?.tag === 'string') throw new Failure(e.payload.tag, e.payload.val);
    throw e;
  }
}

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
    const clock = { nowMs: this.clock.nowMs };
    const random = { randomU64 };
    const types = { Response };
    // jco 1.35's glue looks imports up without their version; both spellings are given.
    const exports = instantiate({
      'idem:guard/clock': clock,
      'idem:guard/clock@0.3.0': clock,
      'idem:guard/random': random,
      'idem:guard/random@0.3.0': random,
      'idem:guard/types': types,
      'idem:guard/types@0.3.0': types,
    });
    this.guard = exports.guard;
    this.testing = exports.testing;
    const p = scenario.policy;
    this.policy = { leaseMs: BigInt(p.lease_ms), retentionMs: BigInt(p.retention_ms), maxResponseBytes: p.max_response_bytes };
  }

  begin(key, fingerprint) {
    const decision = guarded(() => this.guard.begin(key, fingerprint, this.policy));
    // A replay's handle comes back as the Response the store made: its bytes.
    return decision.tag === 'replay' ? { tag: 'replay', val: decision.val.response } : decision;
  }

  complete(claim, response) {
    const { status, headers, body } = response;
    guarded(() => this.guard.complete(claim, new Response(status, headers, body), this.policy));
  }

  release(claim) {
    guarded(() => this.guard.release(claim));
  }

  renew(claim) {
    return guarded(() => this.guard.renew(claim, this.policy));
  }

  saveCheckpoint(claim, checkpoint) {
    return guarded(() => this.guard.saveCheckpoint(claim, checkpoint, this.policy));
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
    const scenario = load(file);
    let broken = 0;
    for (const [i, step] of scenario.steps.entries()) {
      const wrong = mutate(step.expect);
      if (!wrong) continue;
      const mutant = structuredClone(scenario);
      mutant.steps[i].expect = wrong;
      await assert.rejects(
        play(mutant, new ComposedHost(mutant, compositions.testing)),
        (e) => e.message.startsWith(`step ${i} `),
        `${file}: step ${i} mutated`,
      );
      broken += 1;
    }
    assert.ok(broken > 0, `${file}: no step could be broken`);
  });
}
