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
// 1.35's generated code looks imports up without the `@0.3.0` version its
// .d.ts shows; both spellings are given. The glue asks only for what the
// guest's core module imports: not `store.delete`, nor the response's
// constructor, `headers` or `body` (wit/types.wit: for a store written as a
// component), which are given anyway as the WIT has them. The imported `response` resource
// is a class given as `Response` in `idem:guard/types`: jco lowers an
// instance of it (and only that) as an own handle, lifts a borrow or a
// handed-back own handle as the very instance it lowered, and calls its
// methods. Here an instance wraps a response `{ status, headers, body }`,
// so the store and the caller see plain responses as with idem-abi.js.

import { readFileSync } from 'node:fs';
import { Failure, responseSize, StoreFailure, sameResponse } from './idem-abi.js';

/** The host side of `idem:guard/types`' `response`: a response `{ status, headers, body }` behind a handle. */
class Response {
  #size;

  /** `new Response(response)` here; `new Response(status, headers, body)` as the WIT's constructor. */
  constructor(response, headers, body) {
    if (typeof response === 'number') response = { status: response, headers, body };
    this.#size = responseSize(response); // checks its shape, as idem-abi.js does when it makes a handle
    this.response = response;
  }
  status() {
    return this.response.status;
  }
  size() {
    return BigInt(this.#size);
  }
  sameAs(other) {
    return sameResponse(this.response, other.response);
  }
  headers() {
    return this.response.headers;
  }
  body() {
    return this.response.body;
  }
}

/** A store's entry with its record's response behind a handle (`entry.response`), as jco lowers it. */
function entryOf(entry) {
  if (!entry) return entry;
  const response = entry.record.response;
  return { record: entry.record, response: response ? new Response(response) : undefined, version: entry.version };
}

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
      // The store's records hold their response (`record.response`), as idem-abi.js hands them.
      const storeImport = {
        get: (key, nowMs) => entryOf(thrown(store.get(key, nowMs))),
        insert: (key, record, nowMs) => {
          const outcome = thrown(store.insert(key, { ...record, response: undefined }, nowMs));
          return outcome?.tag === 'existing' ? { tag: 'existing', val: entryOf(outcome.val) } : outcome;
        },
        replace: (key, expectedVersion, record, response, nowMs) =>
          thrown(store.replace(key, expectedVersion, { ...record, response: response?.response }, nowMs)),
        delete: (key, expectedVersion, nowMs) => thrown(store.delete(key, expectedVersion, nowMs)),
      };
      const typesImport = { Response };
      const randomImport = { randomU64: () => random.randomU64() };
      const imports = {
        'idem:guard/clock': clock,
        'idem:guard/clock@0.3.0': clock,
        'idem:guard/random': randomImport,
        'idem:guard/random@0.3.0': randomImport,
        'idem:guard/store': storeImport,
        'idem:guard/store@0.3.0': storeImport,
        'idem:guard/types': typesImport,
        'idem:guard/types@0.3.0': typesImport,
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
      /** A `replay`'s handle, handed back, is the Response it was lowered as: its response. */
      const decision = (value) => (value?.tag === 'replay' ? { tag: 'replay', val: value.val.response } : value);
      return {
        begin: (key, fingerprint, policy) => decision(result(() => guard.begin(key, fingerprint, policy))),
        complete: (claim, response, policy) => result(() => guard.complete(claim, new Response(response), policy)),
        release: (claim) => result(() => guard.release(claim)),
        renew: (claim, policy) => result(() => guard.renew(claim, policy)),
        saveCheckpoint: (claim, checkpoint, policy) => result(() => guard.saveCheckpoint(claim, checkpoint, policy)),
        fingerprint: (parts) => guard.fingerprint(parts),
        beginRequest: (key, parts, policy) => decision(result(() => guard.beginRequest(key, parts, policy))),
      };
    },
  };
}
