// The guard composed with a store written as a component
// (examples/store-component, composed by scripts/compose-store.sh with wac),
// hosted through jco's transpiled glue as a third party would host it: the
// host gives it only `clock`, `random` and the `response` resource (world
// idem:guard/idem-with-store). For tests and benchmarks; not part of the
// package (not in package.json `files`).
//
// The compositions come from IDEM_STORE_COMPONENTS (the directory
// scripts/compose-store.sh wrote; examples/run-polyglot-tests.sh sets it), or
// else from running that script (which needs cargo). Each is transpiled with
// the pinned jco (`jco transpile --instantiation sync --no-wasi-shim`) into a
// scratch directory of this process's, removed at exit.

import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { Failure } from '../idem-abi.js';
import { localClock, StoreError } from '../index.js';

const root = fileURLToPath(new URL('../../../', import.meta.url));

/** The tests' composition (it also exports the store and its `testing` hooks), `wac plug`'s (the guard alone), and the store alone. */
export const TESTING = 'guard-with-memory-store.wasm';
export const PLUGGED = 'idem-with-memory-store.wasm';
export const STORE = 'memory-store.wasm';

let dir = null;
/** The directory holding the compositions. */
function components() {
  dir ??=
    process.env.IDEM_STORE_COMPONENTS ||
    execFileSync('bash', [join(root, 'scripts/compose-store.sh')], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] }).trim();
  return dir;
}

let scratch = null;
const transpiled = new Map();
/** `jco transpile`s the composition `file` (once per process) and loads its glue: `instantiate(imports)` (its core modules compiled once). */
export function transpile(file) {
  if (!transpiled.has(file)) transpiled.set(file, transpileNow(file));
  return transpiled.get(file);
}

async function transpileNow(file) {
  if (!scratch) {
    scratch = mkdtempSync(join(tmpdir(), 'idem-store-component-'));
    process.on('exit', () => rmSync(scratch, { recursive: true, force: true }));
  }
  const out = join(scratch, file.replace(/\.wasm$/, ''));
  const jco = join(root, 'packages/js/node_modules/.bin/jco');
  execFileSync(jco, ['transpile', join(components(), file), '-o', out, '--name', 'composed', '--instantiation', 'sync', '--no-wasi-shim', '-q']);
  const { instantiate } = await import(pathToFileURL(join(out, 'composed.js')).href);
  const modules = new Map();
  const coreModule = (name) => {
    if (!modules.has(name)) modules.set(name, new WebAssembly.Module(readFileSync(join(out, name))));
    return modules.get(name);
  };
  return (imports) => instantiate(coreModule, imports);
}

/**
 * The host's `response` resource (wit/types.wit), as jco takes it: a class
 * given as `Response` in `idem:guard/types`. jco calls the constructor when
 * the store makes a response, the methods when the guard or the store calls
 * them, and lowers an instance of this class (only) as a handle.
 */
export class Response {
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
export function randomU64() {
  return crypto.getRandomValues(new BigUint64Array(1))[0];
}

/** What the composition imports: `clock` (`{ nowMs(): bigint }`), random and `Response`; jco 1.35 looks imports up without their version, so both spellings are given. */
export function imports(clock, random = { randomU64 }) {
  const types = { Response };
  return {
    'idem:guard/clock': clock,
    'idem:guard/clock@0.3.0': clock,
    'idem:guard/random': random,
    'idem:guard/random@0.3.0': random,
    'idem:guard/types': types,
    'idem:guard/types@0.3.0': types,
  };
}

/** A thrown jco `ComponentError` whose `payload` is a guard-error, as `make(kind, detail)`. */
export function guarded(call, make) {
  try {
    return call();
  } catch (e) {
    if (e && Object.hasOwn(e, 'payload') && typeof e.payload?.tag === 'string') throw make(e.payload.tag, e.payload.val);
    throw e;
  }
}

/** A replay's handle comes back as the Response the store made: its bytes. */
export const decision = (d) => (d.tag === 'replay' ? { tag: 'replay', val: d.val.response } : d);

/**
 * A composition as a `guest` for `Guard.load` (the shape `jcoGuest()` has),
 * for benchmarks: `Guard.load({ store, guest: await composedGuest(PLUGGED) })`
 * runs @idem/guard's calls on it. The store given to Guard.load is not used
 * (the store is inside the composition); each instance the guard makes is a
 * new, empty store. Guard errors come back as idem-abi.js's `Failure`, as
 * jcoGuest's do.
 */
export async function composedGuest(file) {
  const instantiate = await transpile(file);
  return {
    instantiate(_store, clock, random) {
      const guard = instantiate(imports(clock, { randomU64: () => random.randomU64() })).guard;
      const result = (call) => {
        try {
          return guarded(call, (kind, detail) => new Failure(kind, detail));
        } catch (e) {
          if (e instanceof Failure) return e;
          throw e;
        }
      };
      return {
        begin: (key, fingerprint, policy) => {
          const d = result(() => guard.begin(key, fingerprint, policy));
          return d instanceof Failure ? d : decision(d);
        },
        complete: (claim, r, policy) => result(() => guard.complete(claim, new Response(r.status, r.headers, r.body), policy)),
        release: (claim) => result(() => guard.release(claim)),
        renew: (claim, policy) => result(() => guard.renew(claim, policy)),
        saveCheckpoint: (claim, checkpoint, policy) => result(() => guard.saveCheckpoint(claim, checkpoint, policy)),
        fingerprint: (parts) => guard.fingerprint(parts),
        beginRequest: (key, parts, policy) => {
          const d = result(() => guard.beginRequest(key, parts, policy));
          return d instanceof Failure ? d : decision(d);
        },
      };
    },
  };
}

/** A record as @idem/guard's stores hand it: its response (a plain `{ status, headers, body }`) inside. */
function entryOf(entry) {
  if (!entry) return undefined;
  return { record: { ...entry.record, response: entry.response?.response }, version: entry.version };
}

/** A `store-error` the component returned (jco throws it), as the package's `StoreError`. */
function stored(call) {
  try {
    return call();
  } catch (e) {
    if (e && Object.hasOwn(e, 'payload') && typeof e.payload?.tag === 'string') throw new StoreError(e.payload.tag, e.payload.val);
    throw e;
  }
}

/**
 * The store component alone (`memory-store.wasm`, through jco) as a store of
 * @idem/guard's: `Guard.load({ store: await componentStore() })` runs the
 * guard with the package's own binding and only the store calls through jco's
 * glue. The response bytes cross into the store component on `replace` and
 * back out on every read that holds one. Its records live in this process
 * (time authority: `localClock`); `fault`, `clearFaults` and `peek` are the
 * component's `testing` hooks.
 */
export async function componentStore() {
  const instance = (await transpile(STORE))(imports(localClock));
  const { store, testing } = instance;
  return {
    clock: localClock,
    get: (key, nowMs) => entryOf(stored(() => store.get(key, nowMs))),
    insert(key, record, nowMs) {
      const { response: _none, ...head } = record;
      const outcome = stored(() => store.insert(key, head, nowMs));
      return outcome.tag === 'existing' ? { tag: 'existing', val: entryOf(outcome.val) } : outcome;
    },
    replace(key, expectedVersion, record, nowMs) {
      const { response, ...head } = record;
      const lent = response ? new Response(response.status, response.headers, response.body) : undefined;
      return stored(() => store.replace(key, expectedVersion, head, lent, nowMs));
    },
    delete: (key, expectedVersion, nowMs = localClock.nowMs()) => stored(() => store.delete(key, expectedVersion, nowMs)),
    fault: (primitive, { kind, message, count }) => testing.setFault(primitive, kind, message ?? '', count),
    clearFaults: () => testing.clearFaults(),
    peek: (key, nowMs) => entryOf(testing.peek(key, nowMs)),
  };
}
