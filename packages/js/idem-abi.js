// The guard component run through Node's WebAssembly API, with the canonical
// ABI of `idem:guard@0.3.0` written once, here, for this WIT.
//
// Why: jco 1.35's generated glue spends most of a guarded call on work a
// synchronous call does not need — a debug-log check that reads
// `process.env` on every call and component-model-async task bookkeeping
// (97–121 µs a call measured in issue 17). This module takes the guest's core
// module out of the very component bytes `idem component --out` writes
// (nothing is rebuilt or transpiled), instantiates it with
// `WebAssembly.Instance`, and moves values in linear memory as the canonical
// ABI says (component-model design/mvp/CanonicalABI.md: `flatten_functype`,
// `store`, `load`, `lift_flat`).
//
// A response (`types.response`) is a resource the host defines: the guest
// holds i32 handles into this instance's table of host responses
// (`Handles`), never their bytes. `complete`'s response and the response of
// every record a store read are added to it (own handles lowered); the
// response's methods (`status`, `size`, `same-as`) and `replace`'s
// `option<borrow<response>>` look handles up (borrows lifted); the guest's
// `[resource-drop]` and a `replay` decision remove them (own handles lifted,
// the replay's response handed to the caller as the store read it). The
// guest keeps no state between calls, so the table is empty after every
// export call: one that ends holding a handle is an `AbiViolation`, and the
// table is emptied whatever happened (a trap included).
//
// What the component model would also check, this binding checks: pointers
// and lengths the guest hands back are bounds-checked (lists' alignment too),
// strings must be UTF-8, discriminants in range, handles live; a violation
// throws `AbiViolation`, which the guard treats as a trap (the instance is
// dropped).
//
// The layouts live in one place, the WIT mirror below (each `// wit/...`
// comment says where a type comes from). Sizes, alignments, offsets and the
// flattened core signatures are computed from it with the canonical ABI's
// rules, and `Guest.load` compares every computed signature with the core
// module's own (read from its type, import, function and export sections): a
// component whose types moved is refused at load, not mis-read at run time.
// Moving to the next contract: edit the mirror, `VERSION`, and the few
// lift/lower functions that name fields. `packages/python/src/idem_guard/abi.py`
// is the same binding for Python.

import { readFileSync } from 'node:fs';

const VERSION = '0.3.0';
const contract = (iface) => `idem:guard/${iface}@${VERSION}`;

/** The guest broke the canonical ABI, or the component is not the shape this binding reads. */
export class AbiViolation extends Error {
  constructor(message) {
    super(message);
    this.name = 'AbiViolation';
  }
}

/**
 * A `store-error` a store function returns rather than throws (`payload` is
 * the variant, as on a thrown `StoreError`). The binding takes both; the
 * journal returns it, since throwing through the guest's frames costs V8
 * several microseconds per throw.
 */
export class StoreFailure {
  constructor(payload) {
    this.payload = payload;
  }
}

/** What `#ask` returns once it has written an import's `store-error`. */
const FAILED = Symbol('store-error written');

/** A `guard-error` as the guard returned it (a value, not thrown: the binding stays neutral). */
export class Failure {
  constructor(kind, detail) {
    this.kind = kind;
    this.detail = detail;
  }
}

// --- the canonical ABI's layout rules ---------------------------------------

const alignTo = (n, align) => Math.ceil(n / align) * align;

const scalar = (size, flat) => ({ size, align: size, flat: [flat] });
const list = (element) => ({ size: 8, align: 4, flat: ['i32', 'i32'], element });

function record(...fields) {
  const offset = {};
  let end = 0;
  for (const [name, ty] of fields) {
    end = alignTo(end, ty.align);
    offset[name] = end;
    end += ty.size;
  }
  const align = Math.max(...fields.map(([, ty]) => ty.align));
  return { size: alignTo(end, align), align, flat: fields.flatMap(([, ty]) => ty.flat), offset, fields: Object.fromEntries(fields) };
}

function variant(...cases) {
  const names = cases.map(([name]) => name);
  const payloads = cases.map(([, ty]) => ty).filter(Boolean);
  const disc = names.length <= 256 ? 1 : names.length <= 65536 ? 2 : 4;
  const payloadAlign = Math.max(1, ...payloads.map((ty) => ty.align));
  const payload = alignTo(disc, payloadAlign);
  const align = Math.max(disc, payloadAlign);
  const flat = [];
  for (const ty of payloads) {
    ty.flat.forEach((f, i) => {
      flat[i] = flat[i] === undefined || flat[i] === f ? f : 'i64'; // only i32 and i64 occur in this WIT
    });
  }
  return {
    size: alignTo(payload + Math.max(0, ...payloads.map((ty) => ty.size)), align),
    align,
    payload,
    flat: ['i32', ...flat],
    cases: names,
    index: Object.fromEntries(names.map((n, i) => [n, i])),
    /** The case name of a discriminant read from the guest. */
    caseOf(i) {
      if (!(i < names.length)) throw new AbiViolation(`discriminant ${i} out of range for ${names.join('|')}`);
      return names[i];
    },
  };
}

const enumOf = (...names) => variant(...names.map((n) => [n]));
const option = (ty) => variant(['none'], ['some', ty]);
const result = (ok, err) => variant(['ok', ok], ['err', err]);
const tuple = (...types) => record(...types.map((ty, i) => [String(i), ty]));

const U8 = scalar(1, 'i32');
const U16 = scalar(2, 'i32');
const U32 = scalar(4, 'i32');
const U64 = scalar(8, 'i64');
const STRING = list(U8);

const MAX_FLAT_PARAMS = 16;
const MAX_FLAT_RESULTS = 1;

/**
 * The core parameters of a function: its flat values, or, past 16 of them,
 * one pointer to the parameters stored as a tuple (`PARAMS[name]` below).
 */
function flatParams(params) {
  const flat = params.flatMap((ty) => ty.flat);
  return flat.length > MAX_FLAT_PARAMS ? ['i32'] : flat;
}

/** `flatten_functype` for a lifted export: results over one core value come back through a pointer. */
function exportSignature(params, res) {
  const results = res ? res.flat : [];
  return { params: flatParams(params), results: results.length > MAX_FLAT_RESULTS ? ['i32'] : results };
}

/** `flatten_functype` for a lowered import: results over one core value go to a pointer the guest passes last. */
function importSignature(params, res) {
  const flat = flatParams(params);
  const results = res ? res.flat : [];
  return results.length > MAX_FLAT_RESULTS ? { params: [...flat, 'i32'], results: [] } : { params: flat, results };
}

// --- the WIT, mirrored: the one place the layouts come from -----------------

// wit/types.wit
/** An `own<response>` or `borrow<response>`: an index into the instance's `Handles`, one i32. */
const HANDLE = scalar(4, 'i32');
const BOOL = scalar(1, 'i32');
const STATE = enumOf('processing', 'done');
export const CHECKPOINT = record(['phase', STRING], ['data', list(U8)]);
const OPTION_CHECKPOINT = option(CHECKPOINT);
export const RECORD = record(
  ['fingerprint', STRING],
  ['state', STATE],
  ['holder', U64],
  ['leaseUntilMs', U64],
  ['expiresAtMs', U64],
  ['checkpoint', OPTION_CHECKPOINT],
);
const OPTION_HANDLE = option(HANDLE);
export const ENTRY = record(['record', RECORD], ['response', OPTION_HANDLE], ['version', U64]);

// wit/guard.wit
const POLICY = record(['leaseMs', U64], ['retentionMs', U64], ['maxResponseBytes', U32]);
export const CLAIM = record(
  ['key', STRING],
  ['fingerprint', STRING],
  ['fence', U64],
  ['holder', U64],
  ['leaseUntilMs', U64],
  ['expiresAtMs', U64],
  ['checkpoint', OPTION_CHECKPOINT],
);
export const DECISION = variant(['proceed', CLAIM], ['replay', HANDLE], ['in-flight', U64], ['conflict']);
const GUARD_ERROR = variant(['unavailable', STRING], ['invalid-input', STRING], ['stale-claim', STRING]);
const HEADER = tuple(STRING, list(U8)); // an element of `request-parts.headers`
const REQUEST_PARTS = record(['method', STRING], ['path', STRING], ['headers', list(HEADER)], ['body', list(U8)]);
export const BEGIN_RESULT = result(DECISION, GUARD_ERROR);
const UNIT_RESULT = result(undefined, GUARD_ERROR);
const CLAIM_RESULT = result(CLAIM, GUARD_ERROR); // renew, save-checkpoint

// wit/store.wit. The 0.3.0 guest imports `get`, `insert` and `replace`, never
// `delete` (hosts call it for operators); of the `response` resource,
// `status`, `size`, `same-as` and its destructor, never the constructor,
// `headers` or `body` (a store written as a component calls those, and the
// guest is not one). This binding lowers exactly what the guest imports:
// `Guest.load` refuses a component that imports anything else, naming it.
const STORE_ERROR = variant(['unavailable', STRING], ['corrupt', STRING]);
const OPTION_ENTRY = option(ENTRY);
export const GET_RESULT = result(OPTION_ENTRY, STORE_ERROR);
const INSERT_OUTCOME = variant(['inserted', U64], ['existing', ENTRY]);
export const INSERT_RESULT = result(INSERT_OUTCOME, STORE_ERROR);
/** Whether the record was written (at `expected-version + 1`, the contract's, not the store's). */
export const REPLACE_RESULT = result(BOOL, STORE_ERROR);

// The functions whose flat parameters are over 16, as the tuples they are passed as.
export const PARAMS = {
  complete: tuple(CLAIM, HANDLE, POLICY),
  saveCheckpoint: tuple(CLAIM, CHECKPOINT, POLICY),
  'store/replace': tuple(STRING, U64, RECORD, OPTION_HANDLE, U64),
};

// wit/guard.wit's exports and the imports of wit/types.wit (the response's
// methods and destructor), wit/clock.wit, wit/random.wit and wit/store.wit:
// core signatures.
export const EXPORTS = {
  begin: exportSignature([STRING, STRING, POLICY], BEGIN_RESULT),
  complete: exportSignature([CLAIM, HANDLE, POLICY], UNIT_RESULT),
  release: exportSignature([CLAIM], UNIT_RESULT),
  renew: exportSignature([CLAIM, POLICY], CLAIM_RESULT),
  saveCheckpoint: exportSignature([CLAIM, CHECKPOINT, POLICY], CLAIM_RESULT),
  fingerprint: exportSignature([REQUEST_PARTS], STRING),
  beginRequest: exportSignature([STRING, REQUEST_PARTS, POLICY], BEGIN_RESULT),
};
/** The WIT names of the exports (the core module's export names use them). */
const WIT_NAME = { saveCheckpoint: 'save-checkpoint', beginRequest: 'begin-request' };
export const IMPORTS = {
  'types/[method]response.status': importSignature([HANDLE], U16),
  'types/[method]response.size': importSignature([HANDLE], U64),
  'types/[method]response.same-as': importSignature([HANDLE, HANDLE], BOOL),
  'types/[resource-drop]response': importSignature([HANDLE]),
  'clock/now-ms': importSignature([], U64),
  'random/random-u64': importSignature([], U64),
  'store/get': importSignature([STRING, U64], GET_RESULT),
  'store/insert': importSignature([STRING, RECORD, U64], INSERT_RESULT),
  'store/replace': importSignature([STRING, U64, RECORD, OPTION_HANDLE, U64], REPLACE_RESULT),
};

// Where the payloads sit, from the layouts above.
const BEGIN_CASE = BEGIN_RESULT.payload + DECISION.payload;
const ENTRY_AT = INSERT_RESULT.payload + INSERT_OUTCOME.payload;
const GET_ENTRY_AT = GET_RESULT.payload + OPTION_ENTRY.payload;

// --- the component file -----------------------------------------------------

function leb128(bytes, at) {
  let value = 0;
  let shift = 0;
  for (;;) {
    const byte = bytes[at++];
    value += (byte & 0x7f) * 2 ** shift;
    shift += 7;
    if (byte < 0x80) return [value, at];
  }
}

function sections(bytes, from, each) {
  for (let at = from; at < bytes.length; ) {
    const id = bytes[at];
    const [size, start] = leb128(bytes, at + 1);
    each(id, start, start + size);
    at = start + size;
  }
}

/** The core modules a component embeds at its top level (section id 1), in order. */
export function coreModules(component) {
  const header = [0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00];
  if (!header.every((b, i) => component[i] === b)) {
    throw new AbiViolation('not a component (expected the component-model binary, version 0xd, layer 1)');
  }
  const modules = [];
  sections(component, 8, (id, start, end) => {
    if (id === 1) modules.push(component.subarray(start, end));
  });
  return modules;
}

const VALTYPES = { 0x7f: 'i32', 0x7e: 'i64', 0x7d: 'f32', 0x7c: 'f64' };

/**
 * The function types of a core module's imports and exports, from its type,
 * import, function and export sections (the JS API cannot tell them).
 */
function coreSignatures(wasm) {
  const types = [];
  const funcs = []; // type index of each function, imports first
  const imports = new Map();
  const exports = new Map();
  let at;
  const u32 = () => {
    let v;
    [v, at] = leb128(wasm, at);
    return v;
  };
  const name = () => {
    const n = u32();
    at += n;
    return new TextDecoder().decode(wasm.subarray(at - n, at));
  };
  const valtypes = () =>
    Array.from({ length: u32() }, () => {
      const type = VALTYPES[wasm[at++]];
      if (!type) throw new AbiViolation(`unsupported value type 0x${wasm[at - 1].toString(16)}`);
      return type;
    });
  const limits = () => {
    const flags = wasm[at++];
    u32();
    if (flags & 1) u32();
  };
  sections(wasm, 8, (id, start) => {
    at = start;
    if (id === 1) {
      for (let n = u32(); n > 0; n--) {
        if (wasm[at++] !== 0x60) throw new AbiViolation('unsupported core type (not a plain function type)');
        types.push({ params: valtypes(), results: valtypes() });
      }
    } else if (id === 2) {
      for (let n = u32(); n > 0; n--) {
        const key = `${name()} ${name()}`;
        const kind = wasm[at++];
        if (kind === 0x00) {
          const type = u32();
          funcs.push(type);
          imports.set(key, types[type]);
        } else if (kind === 0x01) {
          at++; // reference type
          limits();
        } else if (kind === 0x02) limits();
        else if (kind === 0x03)
          at += 2; // value type, mutability
        else throw new AbiViolation(`unsupported import kind ${kind}`);
      }
    } else if (id === 3) {
      for (let n = u32(); n > 0; n--) funcs.push(u32());
    } else if (id === 7) {
      for (let n = u32(); n > 0; n--) {
        const key = name();
        const kind = wasm[at++];
        const index = u32();
        if (kind === 0x00) exports.set(key, types[funcs[index]]);
      }
    }
  });
  return { imports, exports };
}

const guests = new Map();

/** The guard's core module, compiled once per component file, checked against the WIT mirror. */
export class Guest {
  static load(path) {
    const key = String(path);
    let guest = guests.get(key);
    if (!guest) {
      let bytes;
      try {
        bytes = readFileSync(path);
      } catch (e) {
        if (e?.code !== 'ENOENT') throw e;
        throw new Error(
          `no guard component at ${key}: write it with \`idem component --out ${key}\` ` +
            '(packages/js/build.sh writes it into the package), or set IDEM_COMPONENT to the file',
        );
      }
      guest = new Guest(bytes);
      guests.set(key, guest);
    }
    return guest;
  }

  constructor(component) {
    // wit-component wraps the guest with a shim and a fixup module for the
    // imports' indirect calls; the guest is the one that exports memory.
    for (const wasm of coreModules(component)) {
      const module = new WebAssembly.Module(wasm);
      if (WebAssembly.Module.exports(module).some((e) => e.name === 'memory')) {
        this.module = module;
        this.#check(coreSignatures(wasm));
        return;
      }
    }
    throw new AbiViolation('the component has no core module exporting its memory');
  }

  #check({ imports, exports }) {
    const same = (name, actual, want) => {
      if (!actual) throw new AbiViolation(`the component's core module has no function ${name}`);
      if (JSON.stringify(actual) !== JSON.stringify(want)) {
        throw new AbiViolation(`${name}: core signature ${JSON.stringify(actual)}, the WIT mirror says ${JSON.stringify(want)}`);
      }
    };
    for (const [name, signature] of Object.entries(EXPORTS)) {
      const wit = WIT_NAME[name] ?? name;
      same(wit, exports.get(`${contract('guard')}#${wit}`), signature);
      same(`post-${wit}`, exports.get(`cabi_post_${contract('guard')}#${wit}`), { params: ['i32'], results: [] });
    }
    same('cabi_realloc', exports.get('cabi_realloc'), { params: ['i32', 'i32', 'i32', 'i32'], results: ['i32'] });
    this.imports = [];
    for (const [key, signature] of imports) {
      const [module, name] = key.split(' ');
      const iface = module.replace(/^idem:guard\//, '').replace(`@${VERSION}`, '');
      const want = IMPORTS[`${iface}/${name}`];
      if (module !== contract(iface) || !want) {
        throw new AbiViolation(`the component imports ${module} ${name}, which this binding does not provide`);
      }
      same(`${iface}/${name}`, signature, want);
      this.imports.push([iface, name]);
    }
  }

  instantiate(store, clock, random) {
    return new Instance(this, store, clock, random);
  }
}

const decoder = new TextDecoder('utf-8', { fatal: true });
const MAX_U64 = 2n ** 64n - 1n;

/** A value a store returned, for an error message. */
function describe(value) {
  if (typeof value === 'bigint') return `${value}n`;
  try {
    return JSON.stringify(value) ?? String(value);
  } catch {
    return typeof value;
  }
}

// Range checks where a JS value would otherwise wrap silently on its way to
// a core parameter (ToBigInt64, ToInt32), as jco's glue checks too.
function checkedU64(v) {
  if (typeof v !== 'bigint' || v < 0n || v > MAX_U64) throw new RangeError(`${v} is not a u64`);
  return v;
}

/** A u64 from the i64 core value it arrived as (negative above 2^63). */
const unsigned = (v) => (v < 0n ? BigInt.asUintN(64, v) : v);

function checkedU32(v) {
  if (!(Number.isInteger(v) && v >= 0 && v <= 0xffffffff)) throw new RangeError(`${v} is not a u32`);
  return v;
}

// --- the `response` resource: what the host holds behind a handle ------------

/** The UTF-8 length of a header name; a TypeError or RangeError for what is not a well-formed string. */
function nameLength(name) {
  if (typeof name !== 'string') throw new TypeError(`expected a header name string, got ${typeof name}`);
  for (let i = 0; i < name.length; i++) {
    if (name.charCodeAt(i) > 0x7f) {
      if (!name.isWellFormed()) throw new RangeError('header name does not encode as UTF-8 (a lone surrogate)');
      return Buffer.byteLength(name, 'utf8');
    }
  }
  return name.length;
}

function checkedBytes(bytes, what) {
  if (!(bytes instanceof Uint8Array)) throw new TypeError(`expected ${what} as a Uint8Array, got ${typeof bytes}`);
  return bytes.length;
}

/**
 * The `size` of a host response `{ status, headers, body }` (the body's
 * bytes plus every header name's and value's), after checking it has the
 * WIT's shape: status a u16, headers `[string, Uint8Array]` pairs, body a
 * Uint8Array. A response is checked here as it is handed to the guest (as
 * lowering it as a record did before it was a resource): the guest sees
 * only what its methods answer.
 */
export function responseSize({ status, headers, body }) {
  if (!(Number.isInteger(status) && status >= 0 && status <= 0xffff)) throw new RangeError(`status ${status} is not a u16`);
  if (!Array.isArray(headers)) throw new TypeError(`expected the headers as an array, got ${typeof headers}`);
  let size = checkedBytes(body, 'the body');
  for (const [name, value] of headers) size += nameLength(name) + checkedBytes(value, 'a header value');
  return size;
}

function sameBytes(a, b) {
  if (a.length !== b.length) return false;
  if (a.length > 32) return Buffer.from(a.buffer, a.byteOffset, a.length).equals(b);
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

/** `same-as`: the same status, the same headers in the same order (names and values byte for byte), the same body. */
export function sameResponse(a, b) {
  if (a === b) return true;
  if (a.status !== b.status || a.headers.length !== b.headers.length || !sameBytes(a.body, b.body)) return false;
  for (let i = 0; i < a.headers.length; i++) {
    // Well-formed strings (checked when handed to the guest) are equal exactly when their UTF-8 is.
    if (a.headers[i][0] !== b.headers[i][0] || !sameBytes(a.headers[i][1], b.headers[i][1])) return false;
  }
  return true;
}

/**
 * The guest's handles to host responses: index → response (and its size).
 * An own handle lowered to the guest is added; one the guest drops or hands
 * back (`replay`) is removed; a borrow (a method's receiver, `same-as`'s
 * argument, `replace`'s response) is looked up. Index 0 is never a handle,
 * nor is a removed one. The guest keeps no handle past a call, so the
 * instance clears the table after every export call, and indices start
 * again at 1: a replayed run sees the same indices as the run before.
 */
class Handles {
  #responses = [undefined];
  #sizes = [0];
  /** How many handles are live. */
  live = 0;

  add(response) {
    const size = responseSize(response);
    this.#responses.push(response);
    this.#sizes.push(size);
    this.live += 1;
    return this.#responses.length - 1;
  }

  get(handle) {
    const response = this.#responses[handle];
    if (response === undefined) throw new AbiViolation(`${handle >>> 0} is not a live response handle`);
    return response;
  }

  size(handle) {
    this.get(handle);
    return this.#sizes[handle];
  }

  remove(handle) {
    const response = this.get(handle);
    this.#responses[handle] = undefined;
    this.live -= 1;
    return response;
  }

  clear() {
    if (this.#responses.length === 1) return;
    this.#responses.length = 1;
    this.#sizes.length = 1;
    this.live = 0;
  }
}

/**
 * One instance of the guest over one store and clock. After anything thrown
 * (a returned `Failure` is not thrown) it must be dropped: the guest may be
 * half-way through a call.
 *
 * Written for the per-call cost: no intermediate arrays or closures on the
 * way in or out, strings written into and read from linear memory directly
 * (ASCII, the usual key and fingerprint, byte for byte; anything else through
 * Buffer's UTF-8 codec), every export called with its flat arguments (or,
 * where the WIT's parameters flatten to over 16 values, `complete` and
 * `save-checkpoint`, one pointer to them written as a tuple).
 */
class Instance {
  #buffer = null;
  #u8 = null;
  #dv = null;
  #buf = null; // a Node Buffer over the same memory, for its UTF-8 codec
  #len = 0; // the byte length of the last `#putString`
  #handles = new Handles();

  constructor(guest, store, clock, random) {
    this.store = store;
    this.clock = clock;
    const handles = this.#handles;
    const handlers = {
      'types/[method]response.status': (self) => handles.get(self).status,
      'types/[method]response.size': (self) => BigInt(handles.size(self)),
      'types/[method]response.same-as': (self, other) => (sameResponse(handles.get(self), handles.get(other)) ? 1 : 0),
      'types/[resource-drop]response': (handle) => {
        handles.remove(handle);
      },
      'clock/now-ms': () => clock.nowMs(), // a BigInt; wasm's i64 takes it modulo 2^64
      'random/random-u64': () => random.randomU64(),
      'store/get': (...flat) => this.#get(...flat),
      'store/insert': (kp, kl, fp, fl, state, holder, leaseUntilMs, expiresAtMs, checkpoint, phasePtr, phaseLen, dataPtr, dataLen, nowMs, ret) =>
        this.#insert(kp, kl, fp, fl, state, holder, leaseUntilMs, expiresAtMs, checkpoint, phasePtr, phaseLen, dataPtr, dataLen, nowMs, ret),
      'store/replace': (params, ret) => this.#replace(params, ret),
    };
    const imports = {};
    for (const [iface, name] of guest.imports) {
      imports[contract(iface)] ??= {};
      imports[contract(iface)][name] = handlers[`${iface}/${name}`];
    }
    const e = new WebAssembly.Instance(guest.module, imports).exports;
    this.memory = e.memory;
    this.realloc = e.cabi_realloc;
    const g = contract('guard');
    for (const name of Object.keys(EXPORTS)) {
      const wit = WIT_NAME[name] ?? name;
      this[`${name}Export`] = e[`${g}#${wit}`];
      this[`${name}Post`] = e[`cabi_post_${g}#${wit}`];
    }
  }

  /**
   * Linear memory as it is now: call after the guest ran (it may have grown).
   * Growing detaches the old ArrayBuffer, so a view of length 0 is stale: that
   * check is cheaper than reading `memory.buffer` each time.
   */
  #view() {
    if (this.#u8 === null || this.#u8.length === 0) {
      this.#buffer = this.memory.buffer;
      this.#u8 = new Uint8Array(this.#buffer);
      this.#dv = new DataView(this.#buffer);
      this.#buf = Buffer.from(this.#buffer);
    }
    return this.#dv;
  }

  // Lowering: values into memory the guest then owns. Every `#alloc` may grow
  // memory, so `this.#dv` is read afresh after each one, never kept across.

  /** `cabi_realloc(0, 0, align, size)`; the view is fresh afterwards. */
  #alloc(align, size) {
    const ptr = this.realloc(0, 0, align, size) >>> 0;
    this.#view();
    if (ptr % align || ptr + size > this.#u8.length) throw new AbiViolation(`cabi_realloc returned ${ptr} for ${size} bytes`);
    return ptr;
  }

  #putBytes(bytes) {
    if (!(bytes instanceof Uint8Array)) throw new TypeError(`expected a Uint8Array, got ${typeof bytes}`);
    const length = bytes.length;
    const ptr = this.#alloc(1, length);
    if (length > 32) {
      this.#u8.set(bytes, ptr);
    } else {
      const u8 = this.#u8; // a loop beats `set`'s fixed cost for a short header value or body
      for (let i = 0; i < length; i++) u8[ptr + i] = bytes[i];
    }
    return ptr;
  }

  /**
   * A string as UTF-8 in guest memory; its byte length is left in `#len`.
   * Written in one pass as if ASCII (the usual key and fingerprint), the
   * chars or'ed together and checked once; a string that was not is
   * written again, its allocation resized to its UTF-8 length.
   */
  #putString(s) {
    if (typeof s !== 'string') throw new TypeError(`expected a string, got ${typeof s}`);
    const chars = s.length;
    let ptr = this.#alloc(1, chars);
    const u8 = this.#u8;
    let all = 0;
    for (let i = 0; i < chars; i++) {
      const c = s.charCodeAt(i);
      all |= c;
      u8[ptr + i] = c;
    }
    if (all < 0x80) {
      this.#len = chars;
      return ptr;
    }
    const length = Buffer.byteLength(s, 'utf8');
    ptr = this.realloc(ptr, chars, 1, length) >>> 0;
    this.#view();
    if (ptr + length > this.#u8.length) throw new AbiViolation(`cabi_realloc returned ${ptr} for ${length} bytes`);
    if (this.#buf.utf8Write(s, ptr, length) !== length) {
      throw new RangeError('string does not encode to its UTF-8 length'); // lone surrogates
    }
    this.#len = length;
    return ptr;
  }

  /** A string written as (pointer, length) at `at`. */
  #putStringAt(at, s) {
    const ptr = this.#putString(s);
    this.#dv.setUint32(at, ptr, true);
    this.#dv.setUint32(at + 4, this.#len, true);
  }

  /** A `list<u8>` written as (pointer, length) at `at`. */
  #putBytesAt(at, bytes) {
    const ptr = this.#putBytes(bytes);
    this.#dv.setUint32(at, ptr, true);
    this.#dv.setUint32(at + 4, bytes.length, true);
  }

  /** `list<tuple<string, list<u8>>>`: the array, then each name and value. */
  #putHeaders(headers) {
    const array = this.#alloc(HEADER.align, HEADER.size * headers.length);
    for (let i = 0; i < headers.length; i++) {
      const [name, value] = headers[i];
      const np = this.#putString(name);
      const nl = this.#len;
      const vp = this.#putBytes(value);
      const at = array + i * HEADER.size;
      this.#dv.setUint32(at + HEADER.offset[0], np, true);
      this.#dv.setUint32(at + HEADER.offset[0] + 4, nl, true);
      this.#dv.setUint32(at + HEADER.offset[1], vp, true);
      this.#dv.setUint32(at + HEADER.offset[1] + 4, value.length, true);
    }
    return array;
  }

  /** `option<checkpoint>` at `at`: `undefined` or `null` is `none`. */
  #putCheckpointAt(at, checkpoint) {
    if (checkpoint === undefined || checkpoint === null) {
      this.#dv.setUint8(at, OPTION_CHECKPOINT.index.none);
      return;
    }
    const c = at + OPTION_CHECKPOINT.payload;
    this.#putStringAt(c + CHECKPOINT.offset.phase, checkpoint.phase);
    this.#putBytesAt(c + CHECKPOINT.offset.data, checkpoint.data);
    this.#dv.setUint8(at, OPTION_CHECKPOINT.index.some);
  }

  /** `claim` at `at` (CLAIM's layout). */
  #putClaimAt(at, claim) {
    const o = CLAIM.offset;
    this.#putStringAt(at + o.key, claim.key);
    this.#putStringAt(at + o.fingerprint, claim.fingerprint);
    this.#putCheckpointAt(at + o.checkpoint, claim.checkpoint);
    const dv = this.#dv;
    dv.setBigUint64(at + o.fence, checkedU64(claim.fence), true);
    dv.setBigUint64(at + o.holder, checkedU64(claim.holder), true);
    dv.setBigUint64(at + o.leaseUntilMs, checkedU64(claim.leaseUntilMs), true);
    dv.setBigUint64(at + o.expiresAtMs, checkedU64(claim.expiresAtMs), true);
  }

  #putPolicyAt(at, policy) {
    const dv = this.#dv;
    dv.setBigUint64(at + POLICY.offset.leaseMs, checkedU64(policy.leaseMs), true);
    dv.setBigUint64(at + POLICY.offset.retentionMs, checkedU64(policy.retentionMs), true);
    dv.setUint32(at + POLICY.offset.maxResponseBytes, checkedU32(policy.maxResponseBytes), true);
  }

  /** A claim's 13 flat values (CLAIM.flat), for `release` and `renew`. */
  #claimFlat(claim) {
    const kp = this.#putString(claim.key);
    const kl = this.#len;
    const fp = this.#putString(claim.fingerprint);
    const fl = this.#len;
    let some = 0;
    let phasePtr = 0;
    let phaseLen = 0;
    let dataPtr = 0;
    let dataLen = 0;
    const checkpoint = claim.checkpoint;
    if (checkpoint !== undefined && checkpoint !== null) {
      some = OPTION_CHECKPOINT.index.some;
      phasePtr = this.#putString(checkpoint.phase);
      phaseLen = this.#len;
      dataPtr = this.#putBytes(checkpoint.data);
      dataLen = checkpoint.data.length;
    }
    // biome-ignore format: the 13 flat values of a claim, grouped as CLAIM.flat lists them
    return [
      kp, kl, fp, fl,
      checkedU64(claim.fence), checkedU64(claim.holder), checkedU64(claim.leaseUntilMs), checkedU64(claim.expiresAtMs),
      some, phasePtr, phaseLen, dataPtr, dataLen,
    ];
  }

  // Lifting: the guest's memory into values (copied: the guest frees it in post-return).

  #bounds(ptr, length) {
    if (ptr + length > this.#u8.length) throw new AbiViolation(`${length} bytes at ${ptr} are beyond memory (${this.#u8.length} bytes)`);
  }

  #bytes(ptr, length) {
    this.#bounds(ptr, length);
    return this.#u8.slice(ptr, ptr + length);
  }

  #string(ptr, length) {
    this.#bounds(ptr, length);
    const u8 = this.#u8;
    const end = ptr + length;
    for (let i = ptr; i < end; i++) {
      if (u8[i] > 0x7f) {
        try {
          return decoder.decode(u8.subarray(ptr, end));
        } catch (e) {
          throw new AbiViolation(`string at ${ptr} is not UTF-8: ${e.message}`);
        }
      }
    }
    return this.#buf.latin1Slice(ptr, end); // ASCII: latin-1 and UTF-8 agree
  }

  #stringAt(at) {
    return this.#string(this.#dv.getUint32(at, true), this.#dv.getUint32(at + 4, true));
  }

  #bytesAt(at) {
    return this.#bytes(this.#dv.getUint32(at, true), this.#dv.getUint32(at + 4, true));
  }

  /** A struct the guest passed by pointer: aligned and within memory. */
  #at(ptr, ty) {
    if (ptr % ty.align) throw new AbiViolation(`${ptr} is not aligned to ${ty.align}`);
    this.#bounds(ptr, ty.size);
    return ptr;
  }

  /** `option<checkpoint>` at `at`: `undefined` or `{ phase, data }`. */
  #checkpoint(at) {
    if (OPTION_CHECKPOINT.caseOf(this.#dv.getUint8(at)) === 'none') return undefined;
    const c = at + OPTION_CHECKPOINT.payload;
    return { phase: this.#stringAt(c + CHECKPOINT.offset.phase), data: this.#bytesAt(c + CHECKPOINT.offset.data) };
  }

  #claim(at) {
    const dv = this.#dv;
    const o = CLAIM.offset;
    return {
      key: this.#stringAt(at + o.key),
      fingerprint: this.#stringAt(at + o.fingerprint),
      fence: dv.getBigUint64(at + o.fence, true),
      holder: dv.getBigUint64(at + o.holder, true),
      leaseUntilMs: dv.getBigUint64(at + o.leaseUntilMs, true),
      expiresAtMs: dv.getBigUint64(at + o.expiresAtMs, true),
      checkpoint: this.#checkpoint(at + o.checkpoint),
    };
  }

  /**
   * `record` at `at` (RECORD's layout), as a store takes it: with the
   * `response` stored beside it (a host response, or undefined).
   */
  #record(at, response) {
    const dv = this.#dv;
    const o = RECORD.offset;
    return {
      fingerprint: this.#stringAt(at + o.fingerprint),
      state: STATE.caseOf(dv.getUint8(at + o.state)),
      holder: dv.getBigUint64(at + o.holder, true),
      leaseUntilMs: dv.getBigUint64(at + o.leaseUntilMs, true),
      expiresAtMs: dv.getBigUint64(at + o.expiresAtMs, true),
      response,
      checkpoint: this.#checkpoint(at + o.checkpoint),
    };
  }

  /** `record` from its 11 flat values (RECORD.flat), as `#record` gives it; `insert` writes no response. */
  #recordFlat(fp, fl, state, holder, leaseUntilMs, expiresAtMs, checkpoint, phasePtr, phaseLen, dataPtr, dataLen) {
    return {
      fingerprint: this.#string(fp >>> 0, fl >>> 0),
      state: STATE.caseOf(state >>> 0),
      holder: unsigned(holder),
      leaseUntilMs: unsigned(leaseUntilMs),
      expiresAtMs: unsigned(expiresAtMs),
      response: undefined,
      checkpoint:
        OPTION_CHECKPOINT.caseOf(checkpoint >>> 0) === 'none'
          ? undefined
          : { phase: this.#string(phasePtr >>> 0, phaseLen >>> 0), data: this.#bytes(dataPtr >>> 0, dataLen >>> 0) },
    };
  }

  #failure(at) {
    return new Failure(GUARD_ERROR.caseOf(this.#dv.getUint8(at)), this.#stringAt(at + GUARD_ERROR.payload));
  }

  /** `result<_, guard-error>` at `ret`. */
  #unit(ret) {
    return UNIT_RESULT.caseOf(this.#dv.getUint8(ret)) === 'ok' ? undefined : this.#failure(ret + UNIT_RESULT.payload);
  }

  /** `result<claim, guard-error>` at `ret`. */
  #claimResult(ret) {
    return CLAIM_RESULT.caseOf(this.#dv.getUint8(ret)) === 'ok' ? this.#claim(ret + CLAIM_RESULT.payload) : this.#failure(ret + CLAIM_RESULT.payload);
  }

  /** `result<decision, guard-error>` at `ret`. */
  #decision(ret) {
    const dv = this.#dv;
    if (BEGIN_RESULT.caseOf(dv.getUint8(ret)) === 'err') return this.#failure(ret + BEGIN_RESULT.payload);
    const tag = DECISION.caseOf(dv.getUint8(ret + BEGIN_RESULT.payload));
    if (tag === 'proceed') return { tag, val: this.#claim(ret + BEGIN_CASE) };
    if (tag === 'replay') return { tag, val: this.#handles.remove(dv.getInt32(ret + BEGIN_CASE, true)) }; // own: the guest's handle ends
    if (tag === 'in-flight') return { tag, val: dv.getBigUint64(ret + BEGIN_CASE, true) };
    return { tag };
  }

  // The exports of wit/guard.wit: arguments lowered (flat, or into a tuple
  // the guest owns when there are over 16 flat values), the export called,
  // its result lifted, then `cabi_post_*` lets the guest free the result.
  // Every export but `fingerprint` may be handed response handles (by the
  // store's reads, and `complete` its argument): `#ended` checks that the
  // guest dropped or handed back each, and `finally` empties the table
  // whatever happened (a trap, a throw while lowering), so no response is
  // held past its call.

  /** How many response handles the guest holds: 0 between calls. */
  get handles() {
    return this.#handles.live;
  }

  /** The call's value, once the guest holds no handle (it keeps no state between calls). */
  #ended(value) {
    if (this.#handles.live !== 0) throw new AbiViolation(`the guest kept ${this.#handles.live} response handle(s) past the call`);
    return value;
  }

  /**
   * One export call: `lower` lowers the arguments and calls the export,
   * `lift` reads its result, `post` lets the guest free it; the handle table
   * is emptied whatever happens (a trap, a throw while lowering).
   */
  #call(lower, lift, post) {
    try {
      const ret = lower() >>> 0;
      this.#view();
      // A run the journal discards (a store call it must wait for, or one that
      // diverged) is not lifted: nothing reads its value.
      const value = this.store.runLost?.() === true ? undefined : lift.call(this, ret);
      post(ret);
      return this.#ended(value);
    } finally {
      this.#handles.clear();
    }
  }

  begin(key, fingerprint, policy) {
    const lower = () => {
      const kp = this.#putString(key);
      const kl = this.#len;
      const fp = this.#putString(fingerprint);
      const fl = this.#len;
      return this.beginExport(kp, kl, fp, fl, checkedU64(policy.leaseMs), checkedU64(policy.retentionMs), checkedU32(policy.maxResponseBytes));
    };
    return this.#call(lower, this.#decision, this.beginPost);
  }

  /** A request's parts lowered, as the flat core arguments of `request-parts`: method, path, headers, body. */
  #putParts({ method, path, headers, body }) {
    const mp = this.#putString(method);
    const ml = this.#len;
    const pp = this.#putString(path);
    const pl = this.#len;
    const hp = this.#putHeaders(headers);
    const bp = this.#putBytes(body);
    return [mp, ml, pp, pl, hp, headers.length, bp, body.length];
  }

  beginRequest(key, parts, policy) {
    const lower = () => {
      const kp = this.#putString(key);
      const kl = this.#len;
      // biome-ignore format: the key, the request parts, the policy: begin-request's flat parameters
      return this.beginRequestExport(
        kp, kl, ...this.#putParts(parts),
        checkedU64(policy.leaseMs), checkedU64(policy.retentionMs), checkedU32(policy.maxResponseBytes),
      );
    };
    return this.#call(lower, this.#decision, this.beginRequestPost);
  }

  /** `response` (`{ status, headers, body }`) is handed to the guest as an own handle: it reads, lends, then drops it. */
  complete(claim, response, policy) {
    const lower = () => {
      const handle = this.#handles.add(response);
      const params = PARAMS.complete;
      const at = this.#alloc(params.align, params.size);
      this.#putClaimAt(at + params.offset[0], claim);
      this.#putPolicyAt(at + params.offset[2], policy);
      this.#dv.setInt32(at + params.offset[1], handle, true);
      return this.completeExport(at);
    };
    return this.#call(lower, this.#unit, this.completePost);
  }

  release(claim) {
    return this.#call(() => this.releaseExport(...this.#claimFlat(claim)), this.#unit, this.releasePost);
  }

  renew(claim, policy) {
    const lower = () =>
      this.renewExport(...this.#claimFlat(claim), checkedU64(policy.leaseMs), checkedU64(policy.retentionMs), checkedU32(policy.maxResponseBytes));
    return this.#call(lower, this.#claimResult, this.renewPost);
  }

  saveCheckpoint(claim, checkpoint, policy) {
    if (checkpoint === undefined || checkpoint === null) throw new TypeError('expected a checkpoint { phase, data }');
    const lower = () => {
      const params = PARAMS.saveCheckpoint;
      const at = this.#alloc(params.align, params.size);
      this.#putClaimAt(at + params.offset[0], claim);
      this.#putStringAt(at + params.offset[1] + CHECKPOINT.offset.phase, checkpoint.phase);
      this.#putBytesAt(at + params.offset[1] + CHECKPOINT.offset.data, checkpoint.data);
      this.#putPolicyAt(at + params.offset[2], policy);
      return this.saveCheckpointExport(at);
    };
    return this.#call(lower, this.#claimResult, this.saveCheckpointPost);
  }

  /** No import is called: no handle is ever made. */
  fingerprint(parts) {
    return this.#call(() => this.fingerprintExport(...this.#putParts(parts)), this.#stringAt, this.fingerprintPost);
  }

  // The store imports of wit/store.wit, for a store whose records hold their
  // response as before 0.2's resource (`record.response`: a host response or
  // undefined), the layout every store writes: a response handle the guest
  // lends `replace` is looked up and put in the record the store is handed,
  // and the response of a record the store reads is added to the handles
  // (`entry.response`), so a stored response is never copied into the guest.
  // `replace` answers whether it wrote: the new version is `expected + 1` by
  // contract, which the guest computes. (The response's methods and
  // destructor, and the clock and random imports, are the handlers in the
  // constructor.)
  //
  // A store with a `readsRecord()` that returns false is handed null for the
  // record of that `insert` or `replace` (the journal, answering from its
  // entries, does not read it). A `StoreError` thrown (an own `payload`
  // property holding the `store-error` variant) or a `StoreFailure` returned
  // is the import's `err`; anything else thrown unwinds the guest: a trap.

  #storeError(ret, result, e) {
    if (!(e && Object.hasOwn(e, 'payload') && e.payload?.tag in STORE_ERROR.index)) throw e;
    const ptr = this.#putString(String(e.payload.val));
    const dv = this.#dv;
    dv.setUint8(ret, result.index.err);
    dv.setUint8(ret + result.payload, STORE_ERROR.index[e.payload.tag]);
    dv.setUint32(ret + result.payload + STORE_ERROR.payload, ptr, true);
    dv.setUint32(ret + result.payload + STORE_ERROR.payload + 4, this.#len, true);
  }

  /**
   * The store's answer to `call()`; or, when it threw a `StoreError` or
   * returned a `StoreFailure`, FAILED after writing that `store-error` as
   * the import's `err` at `ret`. Anything else thrown propagates: a trap.
   */
  #ask(ret, result, call) {
    let answer;
    try {
      answer = call();
    } catch (e) {
      this.#storeError(ret, result, e); // throws on what is not a store-error: a trap
      return FAILED;
    }
    if (!(answer instanceof StoreFailure)) return answer;
    this.#storeError(ret, result, answer);
    return FAILED;
  }

  /** The record at `at` with `response`, or null for a store that will not read it (`readsRecord()`). */
  #recordFor(at, response) {
    return this.store.readsRecord?.() === false ? null : this.#record(at, response);
  }

  #get(kp, kl, nowMs, ret) {
    ret >>>= 0;
    this.#view();
    this.#at(ret, GET_RESULT);
    const key = this.#string(kp >>> 0, kl >>> 0);
    const entry = this.#ask(ret, GET_RESULT, () => this.store.get(key, unsigned(nowMs)));
    if (entry === FAILED) return;
    if (entry) this.#entry(ret + GET_ENTRY_AT, entry);
    const dv = this.#view();
    dv.setUint8(ret, GET_RESULT.index.ok);
    dv.setUint8(ret + GET_RESULT.payload, entry ? OPTION_ENTRY.index.some : OPTION_ENTRY.index.none);
  }

  #insert(kp, kl, fp, fl, state, holder, leaseUntilMs, expiresAtMs, checkpoint, phasePtr, phaseLen, dataPtr, dataLen, nowMs, ret) {
    ret >>>= 0;
    this.#view();
    this.#at(ret, INSERT_RESULT);
    const key = this.#string(kp >>> 0, kl >>> 0);
    const record =
      this.store.readsRecord?.() === false
        ? null
        : this.#recordFlat(fp, fl, state, holder, leaseUntilMs, expiresAtMs, checkpoint, phasePtr, phaseLen, dataPtr, dataLen);
    const now = unsigned(nowMs);
    const outcome = this.#ask(ret, INSERT_RESULT, () => this.store.insert(key, record, now));
    if (outcome === FAILED) return;
    if (outcome?.tag === 'inserted') {
      this.#view();
      this.#dv.setBigUint64(ret + ENTRY_AT, outcome.val, true);
    } else if (outcome?.tag === 'existing') {
      this.#entry(ret + ENTRY_AT, outcome.val);
    } else {
      throw new TypeError(`insert returned ${JSON.stringify(outcome?.tag)}, expected inserted or existing`);
    }
    this.#dv.setUint8(ret, INSERT_RESULT.index.ok);
    this.#dv.setUint8(ret + INSERT_RESULT.payload, INSERT_OUTCOME.index[outcome.tag]);
  }

  /**
   * Writes `entry` at `at` (ENTRY's layout), its strings and lists allocated
   * as they come, the record's response as a new own handle.
   */
  #entry(at, { record: r, version }) {
    const o = RECORD.offset;
    this.#putStringAt(at + o.fingerprint, r.fingerprint);
    this.#putCheckpointAt(at + o.checkpoint, r.checkpoint);
    const response = r.response ? this.#handles.add(r.response) : 0;
    const dv = this.#dv;
    dv.setUint8(at + o.state, STATE.index[r.state]);
    dv.setBigUint64(at + o.holder, checkedU64(r.holder ?? 0n), true);
    dv.setBigUint64(at + o.leaseUntilMs, r.leaseUntilMs, true);
    dv.setBigUint64(at + o.expiresAtMs, r.expiresAtMs, true);
    const h = at + ENTRY.offset.response;
    dv.setUint8(h, response ? OPTION_HANDLE.index.some : OPTION_HANDLE.index.none);
    if (response) dv.setInt32(h + OPTION_HANDLE.payload, response, true);
    dv.setBigUint64(at + ENTRY.offset.version, version, true);
  }

  #replace(params, ret) {
    ret >>>= 0;
    this.#view();
    const at = this.#at(params >>> 0, PARAMS['store/replace']);
    this.#at(ret, REPLACE_RESULT);
    const o = PARAMS['store/replace'].offset;
    const dv = this.#dv;
    const key = this.#stringAt(at + o[0]);
    const expectedVersion = dv.getBigUint64(at + o[1], true);
    const h = at + o[3];
    // A borrow: looked up, and left in the table (the guest drops its own handle later).
    const response = OPTION_HANDLE.caseOf(dv.getUint8(h)) === 'some' ? this.#handles.get(dv.getInt32(h + OPTION_HANDLE.payload, true)) : undefined;
    const record = this.#recordFor(at + o[2], response);
    const nowMs = dv.getBigUint64(at + o[4], true);
    const written = this.#ask(ret, REPLACE_RESULT, () => this.store.replace(key, expectedVersion, record, nowMs));
    if (written === FAILED) return;
    if (typeof written !== 'boolean') {
      // A host bug (a store written for 0.2 returns the new version or undefined): it traps.
      throw new TypeError(`replace returned ${describe(written)}; since contract 0.3 a store's replace returns true (written at expected + 1) or false`);
    }
    const out = this.#view();
    out.setUint8(ret, REPLACE_RESULT.index.ok);
    out.setUint8(ret + REPLACE_RESULT.payload, written ? 1 : 0);
  }
}
