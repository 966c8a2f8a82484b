// The guard component through jco's transpiled glue (`gen/idem.js`, written by
// `npm run transpile`): the reference binding. `idem-abi.js` is the binding
// the guard uses; this one lifts and lowers through jco's own implementation
// of the canonical ABI, so the tests run the conformance scenarios through
// both and catch a mistake in the hand-written one, and
// examples/js/bench.js measures what the lean binding saves. It is not in the
// published package (`files` in package.json): it needs jco, a devDependency.
//
//   const guard = Guard.load({ guest: await jcoGuest() });
//
// Conventions of jco (1.35) this relies on: a `result<T, E>` export returns T
// or throws a `ComponentError` whose own `payload` is E; a `result<T, E>`
// import returns T, or throws a value with an own `payload` property holding
// E (any other thrown `Error` is a host bug and traps the instance); a
// `StoreFailure` the journal returns is thrown for it. jco
// 1.35's generated code looks imports up without the `@0.2.0` version its
// .d.ts shows; both spellings are given.

import { readFileSync } from 'node:fs';
import { Failure, StoreFailure } from './idem-abi.js';

const modules = new Map();

/** Loads the transpiled glue from `dir` (default ./gen/); its core modules are compiled once per process. */
export async function jcoGuest(dir = new URL('./gen/', import.meta.url)) {
  const { instantiate } = await import(new URL('idem.js', dir).href);
  const coreModule = (name) => {
    const path = new URL(name, dir);
    if (!modules.has(path.href)) modules.set(path.href, new WebAssembly.Module(readFileSync(path)));
    return modules.get(path.href);
  };
  return {
    instantiate(store, clock, random) {
      // jco takes a `store-error` only thrown: a returned `StoreFailure` is thrown here (it has the own `payload`).
      const thrown = (value) => {
        if (value instanceof StoreFailure) throw value;
        return value;
      };
      const storeImport = {
        get: (key, nowMs) => thrown(store.get(key, nowMs)),
        insert: (key, record, nowMs) => thrown(store.insert(key, record, nowMs)),
        replace: (key, expectedVersion, record, nowMs) => thrown(store.replace(key, expectedVersion, record, nowMs)),
        delete: (key, expectedVersion) => thrown(store.delete(key, expectedVersion)),
      };
      const randomImport = { randomU64: () => random.randomU64() };
      const imports = {
        'idem:guard/clock': clock,
        'idem:guard/clock@0.2.0': clock,
        'idem:guard/random': randomImport,
        'idem:guard/random@0.2.0': randomImport,
        'idem:guard/store': storeImport,
        'idem:guard/store@0.2.0': storeImport,
      };
      const guard = instantiate(coreModule, imports).guard;
      const result = (call) => {
        try {
          return call();
        } catch (e) {
          if (e && Object.hasOwn(e, 'payload') && typeof e.payload?.tag === 'string') return new Failure(e.payload.tag, e.payload.val);
          throw e;
        }
      };
      return {
        begin: (key, fingerprint, policy) => result(() => guard.begin(key, fingerprint, policy)),
        complete: (claim, response, policy) => result(() => guard.complete(claim, response, policy)),
        release: (claim) => result(() => guard.release(claim)),
        renew: (claim, policy) => result(() => guard.renew(claim, policy)),
        saveCheckpoint: (claim, checkpoint, policy) => result(() => guard.saveCheckpoint(claim, checkpoint, policy)),
        fingerprint: (parts) => guard.fingerprint(parts),
        beginRequest: (key, parts, policy) => result(() => guard.beginRequest(key, parts, policy)),
      };
    },
  };
}
