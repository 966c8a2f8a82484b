// @idem/guard: the idem guard component hosted in Node.js.
//
// The component (the very bytes `idem component --out FILE` writes) makes
// every decision; this file gives it a clock, randomness and a store, and
// wraps its calls in `Guard.run`, which runs a handler at most once per key
// and replays its response to every repeat. A handler of several steps saves
// a checkpoint after each; a retry that takes over after a crash is handed
// the last one and continues from there.
//
//   import { Guard, MemoryStore } from '@idem/guard';
//
//   const guard = Guard.load({ store: new MemoryStore() });
//   const outcome = await guard.run('order-1', 'sku=A&qty=1', async (fence, attempt) => {
//     if (attempt.checkpoint?.phase !== 'charged') attempt.saveCheckpoint('charged', await charge());
//     return ship();
//   });
//
// The binding that runs the component is `idem-abi.js` (its core module with
// the canonical ABI of this WIT written once, a few microseconds a call); the
// jco-transpiled glue (`jco-guest.js`, in the repository but not in the
// package: pass `guest: await jcoGuest()`) is the reference the tests check it
// against. Values either way: u64 is a BigInt; `option<T>` is `undefined` or
// T; a variant is `{ tag, val }`; records have camelCase fields; `list<u8>` is
// a Uint8Array. A store signals a failure the guard should see (`store-error`)
// by throwing a value with an own `payload` property holding it
// (`StoreError`); anything else it throws is a host bug and traps the
// instance.
//
// A response is `{ status, headers: [[name, bytes]], body }`, and a store's
// records hold theirs as `record.response` (present when `done`), as every
// store's layout does. The component never holds a response's bytes: the
// WIT makes the response a resource, and the binding hands the guest
// handles to these objects. So `replace` is lent the very response given to
// `complete`, and a replay is the very response the store read: a store
// keeps bytes of its own (MemoryStore copies them in and out).
//
// An asynchronous store (`async: true`, as RedisStore and PostgresStore
// declare, or `async` methods) makes the guard's calls asynchronous: each
// export is replayed from a journal of import answers (journal.js), and
// `begin`, `complete`, `release`, `renew`, `saveCheckpoint` and
// `beginRequest` return Promises. A synchronous store (MemoryStore) is
// called directly, as before.
//
// Time: the guard judges leases and retention by its store's time authority
// (wit/clock.wit, clock.js), `store.clock`: the server's clock for RedisStore
// and PostgresStore (read at open and every second, carried between reads
// by the monotonic clock), this process's monotonic clock for MemoryStore;
// never `Date.now()`, so a step of this host's wall clock changes no
// decision. Until that clock has been read once, every call but
// `fingerprint` fails closed (`unavailable`, naming why).

import cluster from 'node:cluster';
import { getRandomValues } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { localClock, monotonicMs } from './clock.js';
import { Failure, Guest, responseSize } from './idem-abi.js';
import { JournalPort, replay } from './journal.js';
import { logWith, RunSpan, Tracing } from './telemetry.js';

export { localClock, ManualClock, SyncedClock, wallOffsetMs } from './clock.js';
export { fingerprint } from './fingerprint.js';

// The component ships inside the package (build.sh writes it there before
// `npm pack`), so an installed package needs no path and no env var.
const DEFAULT_COMPONENT = fileURLToPath(new URL('./idem-guard.wasm', import.meta.url));

const encoder = new TextEncoder();
const MAX_U64 = 2n ** 64n - 1n;

/** An error the guard returned: `unavailable`, `invalid-input` or `stale-claim`. */
export class GuardError extends Error {
  constructor(kind, message) {
    super(`${kind}: ${message}`);
    this.name = 'GuardError';
    this.kind = kind;
    this.detail = message;
  }
}

/**
 * The handler ran but its response could not be stored: the store failed,
 * the claim was taken over, or what the handler returned cannot be kept
 * (over `maxResponseBytes`, or not a response at all: `error` is then a
 * `GuardError` `invalid-input` saying why, `response` undefined and `value`
 * what it returned). The key is never released for it: it stays claimed
 * until its lease runs out; only then does a retry run the handler again.
 */
export class NotRecordedError extends Error {
  constructor(response, error, value = response) {
    super(`the handler ran but its response was not recorded: ${error.message}`);
    this.name = 'NotRecordedError';
    this.response = response;
    this.error = error;
    this.value = value;
  }
}

/**
 * A store failure as the guard sees it. Thrown from a store function, the
 * binding hands its `payload` to the component as `store-error` — the guard
 * then fails closed with `unavailable`.
 */
export class StoreError extends Error {
  constructor(kind, message) {
    super(message);
    this.name = 'StoreError';
    // An own property: idem-abi.js and jco's `getErrorPayload` look for exactly this.
    this.payload = { tag: kind, val: message };
  }
}

/**
 * 64 random bits per call from the system's CSPRNG (`crypto.getRandomValues`),
 * the holder id of each claim. Drawn 64 at a time: one draw per call costs
 * more than the rest of a `begin`.
 */
export const systemRandom = {
  pool: new BigUint64Array(64),
  next: 64,
  randomU64() {
    if (this.next === this.pool.length) {
      getRandomValues(this.pool);
      this.next = 0;
    }
    return this.pool[this.next++];
  },
};

/**
 * A response's own copy. The guest hands a store the caller's response (not
 * bytes it copied out of its memory), and a replay hands the caller the
 * response the store read: MemoryStore copies both ways, so it keeps bytes
 * no caller holds, as a store on a server does.
 */
function copyResponse({ status, headers, body }) {
  return { status, headers: headers.map(([name, value]) => [name, value.slice()]), body: body.slice() };
}

/** `entry` with a response of its own (see copyResponse). */
function handedOut(entry) {
  if (!entry?.record.response) return entry;
  return { record: { ...entry.record, response: copyResponse(entry.record.response) }, version: entry.version };
}

/**
 * The store as the guest sees it, noting the last `done` record that passed
 * through it in one guard call: read (`get`, or `insert`'s `existing`) or
 * written (a `replace` that answered true). That record's `expiresAtMs` is
 * how long the key's response is replayed, which the guest does not return:
 * a `replay` hands back the response of the done record just read, and a
 * `complete` succeeds right after writing its done record or reading it
 * back. So the host learns the expiry from the records it passes, with no
 * store call of its own. An asynchronous store's answers are noted as they
 * settle: its guard makes one Witness per call (calls may overlap); a
 * synchronous one shares one, `reset()` before each call.
 */
class Witness {
  /** The response of the last done record seen (for a replay: the one handed back), or undefined. */
  response = undefined;
  /** That record's `expiresAtMs` (a BigInt), or undefined. */
  expiresAtMs = undefined;

  constructor(store) {
    this.store = store;
  }

  reset() {
    this.response = undefined;
    this.expiresAtMs = undefined;
  }

  /** The expiry of the record whose response a `replay` handed back: undefined if none passed here. */
  expiryOf(response) {
    return response !== undefined && response === this.response ? this.expiresAtMs : undefined;
  }

  #saw(record) {
    if (record?.state !== 'done') return;
    this.response = record.response;
    this.expiresAtMs = record.expiresAtMs;
  }

  /** `answer` (a value or a Promise of it) with `note` applied to its value. */
  static #noted(answer, note) {
    if (typeof answer?.then !== 'function') {
      note(answer);
      return answer;
    }
    return answer.then((value) => {
      note(value);
      return value;
    });
  }

  get(key, nowMs) {
    return Witness.#noted(this.store.get(key, nowMs), (entry) => this.#saw(entry?.record));
  }

  insert(key, record, nowMs) {
    return Witness.#noted(this.store.insert(key, record, nowMs), (outcome) => {
      if (outcome?.tag === 'existing') this.#saw(outcome.val?.record);
    });
  }

  replace(key, expectedVersion, record, nowMs) {
    return Witness.#noted(this.store.replace(key, expectedVersion, record, nowMs), (written) => {
      if (written === true) this.#saw(record);
    });
  }

  delete(key, expectedVersion, nowMs) {
    return this.store.delete(key, expectedVersion, nowMs);
  }
}

/**
 * The store primitives of wit/store.wit over a Map, with fault injection:
 * `store.fault('replace', { kind: 'error', message, count })`.
 * Kinds: `error` fails before applying, `lost` applies then fails (a lost
 * reply), `trap` throws a plain Error (a host bug: the instance traps).
 * Its time authority (`clock`) is this process's monotonic clock, anchored
 * once to the wall clock: the records live and die with the process.
 */
export class MemoryStore {
  #records = new Map();
  #faults = new Map();

  /** The store's time authority (wit/clock.wit): `localClock`. */
  get clock() {
    return localClock;
  }

  fault(primitive, rule) {
    if (!['get', 'insert', 'replace', 'delete'].includes(primitive)) {
      throw new Error(`unknown store primitive ${JSON.stringify(primitive)}; expected get, insert, replace or delete`);
    }
    this.#faults.set(primitive, { ...rule });
  }

  clearFaults() {
    this.#faults.clear();
  }

  #apply(primitive, operation) {
    const rule = this.#faults.get(primitive);
    if (!rule) return operation();
    if (rule.count !== undefined && --rule.count <= 0) this.#faults.delete(primitive);
    switch (rule.kind) {
      case 'error':
        throw new StoreError('unavailable', `${rule.message ?? 'injected fault'} (injected on ${primitive})`);
      case 'lost':
        operation();
        throw new StoreError('unavailable', `reply to ${primitive} lost (injected; the operation was applied)`);
      case 'trap':
        throw new Error(`host bug injected on ${primitive}`);
      default:
        throw new Error(`unknown fault kind ${rule.kind}`);
    }
  }

  #live(key, nowMs) {
    const entry = this.#records.get(key);
    return entry && nowMs < entry.record.expiresAtMs ? entry : undefined;
  }

  get(key, nowMs) {
    return this.#apply('get', () => handedOut(this.#live(key, nowMs)));
  }

  insert(key, record, nowMs) {
    return this.#apply('insert', () => {
      const old = this.#records.get(key);
      if (old && nowMs < old.record.expiresAtMs) return { tag: 'existing', val: handedOut(old) };
      // An expired record's version carries on, so an old fence never matches again.
      const version = (old?.version ?? 0n) + 1n;
      this.#records.set(key, { record, version });
      return { tag: 'inserted', val: version };
    });
  }

  /** Writes the record at `expectedVersion + 1` if the live record is at `expectedVersion`: whether it did. */
  replace(key, expectedVersion, record, nowMs) {
    return this.#apply('replace', () => {
      const live = this.#live(key, nowMs);
      if (!live || live.version !== expectedVersion || expectedVersion >= MAX_U64) return false;
      const stored = record.response ? { ...record, response: copyResponse(record.response) } : record;
      this.#records.set(key, { record: stored, version: expectedVersion + 1n });
      return true;
    });
  }

  /**
   * Removes the record live at `nowMs` (default: now by the store's clock),
   * only at `expectedVersion` when given: whether it did. An expired record
   * is absent (false), and its space is freed.
   */
  delete(key, expectedVersion, nowMs = this.clock.nowMs()) {
    return this.#apply('delete', () => {
      const entry = this.#records.get(key);
      if (!entry) return false;
      if (BigInt(nowMs) >= entry.record.expiresAtMs) {
        this.#records.delete(key);
        return false;
      }
      if (expectedVersion !== undefined && entry.version !== expectedVersion) return false;
      return this.#records.delete(key);
    });
  }

  /** The live record for `key`, bypassing faults: for tests and operators. */
  peek(key, nowMs) {
    return this.#live(key, BigInt(nowMs));
  }

  /** How many records the store holds, expired ones not yet purged included. */
  get size() {
    return this.#records.size;
  }

  /**
   * Frees at most `limit` records expired at `nowMs`; returns how many. Reads
   * never depend on it (an expired record is absent either way); a key
   * claimed again after its record was purged starts again at version 1.
   */
  purgeExpired(nowMs, limit) {
    if (!(Number.isInteger(limit) && limit > 0)) throw new RangeError(`limit ${limit} must be a positive whole number`);
    const now = BigInt(nowMs);
    let purged = 0;
    for (const [key, entry] of this.#records) {
      if (purged >= limit) break;
      if (entry.record.expiresAtMs <= now) {
        this.#records.delete(key);
        purged += 1;
      }
    }
    return purged;
  }
}

function bytes(value) {
  if (value === undefined || value === null) return new Uint8Array();
  if (typeof value !== 'string') return value;
  // ASCII (most header values and many bodies) byte for byte: TextEncoder
  // costs more than the whole call into the component for a short string.
  const out = new Uint8Array(value.length);
  for (let i = 0; i < value.length; i++) {
    const c = value.charCodeAt(i);
    if (c > 0x7f) return encoder.encode(value);
    out[i] = c;
  }
  return out;
}

/** An export's value, or its `Failure` thrown as a GuardError. */
function checked(value) {
  if (value instanceof Failure) throw new GuardError(value.kind, value.detail);
  return value;
}

/** `checked`, for an export whose value is unit: undefined. */
function nothing(value) {
  checked(value);
  return undefined;
}

/** `begin`'s decision: a replay carries the `expiresAtMs` of the done record whose response it hands back. */
function decided(value, witness) {
  const decision = checked(value);
  if (decision.tag !== 'replay') return decision;
  return { tag: 'replay', val: decision.val, expiresAtMs: witness.expiryOf(decision.val) };
}

/** `complete`'s result: the `expiresAtMs` of the done record it wrote (or, on a retry that found it written, read back). */
function storedUntil(value, witness) {
  checked(value);
  return witness.expiresAtMs;
}

/** A BigInt instant as `run`'s outcomes give it: a number of ms (undefined stays undefined). */
const msNumber = (ms) => (ms === undefined ? undefined : Number(ms));

/** A response as the component stores it: status, headers in order, body bytes. */
export function toResponse({ status, headers = [], body }) {
  return { status, headers: headers.map(([name, value]) => [name, bytes(value)]), body: bytes(body) };
}

/**
 * What `run` hands its handler beside the fence: the claim it holds as it
 * stands, the recovery point to continue from, and the call that records the
 * next one.
 */
export class Attempt {
  #guard;
  #held;

  constructor(guard, held) {
    this.#guard = guard;
    this.#held = held;
  }

  /** The claim as it stands: renewals and checkpoints move its fence. */
  get claim() {
    return this.#held.claim;
  }

  get fence() {
    return this.#held.claim.fence;
  }

  /**
   * The key's last recovery point, `{ phase, data }` (data a Uint8Array), or
   * null: on entry, how far an earlier attempt whose lease ran out (or that
   * failed and released) got — null on a fresh claim; after `saveCheckpoint`,
   * the one just saved.
   */
  get checkpoint() {
    return this.#held.claim.checkpoint ?? null;
  }

  /**
   * Records that the operation got as far as `phase` (1 to 64 bytes), with
   * `data` (a string or bytes, default empty) to continue from. Call it after
   * a step's effect is durable and before the next step starts, so a retry
   * repeats at most the step that was running. It also extends the lease, and
   * the renewals and the completion go on from the claim it returns. Throws a
   * `GuardError` (`stale-claim`: taken over; `invalid-input`; `unavailable`).
   */
  saveCheckpoint(phase, data) {
    const held = this.#held;
    if (!this.#guard.async) {
      const claim = this.#guard.saveCheckpoint(held.claim, { phase, data });
      held.update(claim);
      return claim;
    }
    // After any renewal in flight, so that each write goes on from the latest claim.
    return held.serial(async () => {
      const claim = await this.#guard.saveCheckpoint(held.claim, { phase, data });
      held.update(claim);
      return claim;
    });
  }
}

/** `run`'s outcome when `begin` failed: `unavailable`, or the error itself (`invalid-input`, a bug). */
function unavailable(e) {
  if (e instanceof GuardError && e.kind !== 'invalid-input') return { outcome: 'unavailable', message: e.detail };
  throw e;
}

/** A short description of a value that is not a response, for an error message. */
function describe(value) {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  return typeof value === 'object' ? 'an object without a numeric status' : `a ${typeof value}`;
}

/**
 * What a handler returned as the response `complete` stores; a GuardError
 * `invalid-input` saying why when it is not one: `{ status, headers?, body? }`
 * with status a whole number, headers `[name, string | bytes]` pairs and the
 * body a string or bytes (the size and the status's range are the guest's to
 * check: `complete` refuses them the same way).
 */
function responseOf(value) {
  try {
    if (value === null || typeof value !== 'object' || typeof value.status !== 'number') {
      throw new TypeError(`the handler returned ${describe(value)}, not a response { status, headers?, body? }`);
    }
    const response = toResponse(value);
    responseSize(response); // the shape the guest takes: status a u16, headers [string, bytes], body bytes
    return response;
  } catch (e) {
    if (e instanceof TypeError || e instanceof RangeError) throw new GuardError('invalid-input', `cannot store the handler's response: ${e.message}`);
    throw e;
  }
}

/** The name `onDecision` and the span give what a `run` that threw came to. */
function thrownOutcome(e) {
  if (e instanceof NotRecordedError) return 'not-recorded';
  if (e instanceof GuardError) return e.kind; // invalid-input
  return 'failed';
}

/**
 * Whether a store keeps its records in this process only (MemoryStore): a
 * guard over it in a `node:cluster` worker shares no key with its siblings,
 * so each worker would run a request the others ran.
 */
export function processLocal(store) {
  return store instanceof MemoryStore || store?.processLocal === true;
}

let warnedLocal = false;

/** `run`'s outcome for a decision other than `proceed`. */
function notProceeding(decision) {
  switch (decision.tag) {
    case 'replay':
      return { outcome: 'replayed', response: decision.val, expiresAtMs: msNumber(decision.expiresAtMs) };
    case 'in-flight':
      return { outcome: 'in-flight', retryAfterMs: Number(decision.val) };
    case 'conflict':
      return { outcome: 'conflict' };
  }
  throw new Error(`unknown decision ${decision.tag}`);
}

/**
 * Whether the guard must treat `store` as asynchronous: it says so
 * (`async: true`), or one of its primitives is an `async` function.
 */
function isAsyncStore(store) {
  if (store.async === true) return true;
  return ['get', 'insert', 'replace'].some((op) => store[op]?.constructor?.name === 'AsyncFunction');
}

/**
 * The time authority of `store` (wit/clock.wit): its own `clock`; for a
 * store private to this process without one, `localClock`. A store shared
 * by several hosts must say whose time it keeps: no host's wall clock will
 * do.
 */
function storeClock(store) {
  if (store.clock !== undefined && store.clock !== null) return store.clock;
  if (processLocal(store)) return localClock;
  throw new TypeError(
    "the store has no clock (its time authority, wit/clock.wit): give it a `clock` property (RedisStore and PostgresStore keep their server's), mark it `processLocal: true` if its records live in this process only, or pass `clock` to Guard.load",
  );
}

/**
 * The Rust host's `check_lease_renewable` (host/src/lease.rs): `run` renews a
 * third of the way into the lease, and a renewal may take the whole store
 * timeout, so a lease shorter than twice the store's timeout could lapse
 * while its holder is alive and renewing. A RangeError in the Rust host's
 * words, then the options it means.
 */
export function checkLeaseRenewable(leaseMs, storeTimeoutMs) {
  const lease = Number(leaseMs);
  const least = 2 * Number(storeTimeoutMs);
  if (lease < least) {
    throw new RangeError(
      `lease (${lease} ms) must be at least twice store-timeout (${Number(storeTimeoutMs)} ms), i.e. at least ${least} ms: ` +
        'a renewal starts a third into the lease and may take the whole store timeout, so a shorter lease could lapse while its holder is alive; ' +
        "lengthen the lease or shorten the store timeout (Guard.load's leaseMs, the store's timeoutMs)",
    );
  }
}

export class Guard {
  #renewer = null;
  #purger = null;
  #guest;
  #store;
  /** The time authority, as given (its `unknown()` says whether its time is known). */
  #authority;
  /** The same clock, its `nowMs` as a BigInt: what the component is given. */
  #clock;
  #random;
  #instance = null;
  /** For an asynchronous store: the store, clock and random the instance sees, answered from journals. */
  #port = null;
  /** For a synchronous store: the store the instance sees, noting the done records of each call (Witness). */
  #witness;
  /** `(level, message, fields)`, or null: no logger. */
  #log = null;
  #onDecision = null;
  #tracing;

  /**
   * @param {object} options
   * @param {object} options.store   the store primitives (default: a new MemoryStore); an
   *   asynchronous one (`async: true`, e.g. RedisStore) makes the guard's calls return Promises
   * @param {object} options.clock   `{ nowMs(): bigint, unknown?(): string | null }`, the time leases and
   *   retention are judged by (default: the store's time authority, `store.clock`: the server's clock for
   *   RedisStore and PostgresStore, this process's monotonic clock for MemoryStore); for tests, a ManualClock.
   *   While `unknown()` says why its time is not known, every call but `fingerprint` fails closed (`unavailable`)
   * @param {object} options.random  `{ randomU64(): bigint }`, the claims' holder ids (default: crypto's CSPRNG)
   * @param {number} options.leaseMs how long a claim is held (default 30 s)
   * @param {number} options.retentionMs how long keys are remembered (default 24 h)
   * @param {number} options.maxResponseBytes the largest stored response (default 1 MiB)
   * @param {boolean} options.renewLease whether `run` renews the claim's lease while its handler runs (default true);
   *   with it, on a store with a `timeoutMs` and its own clock, `leaseMs` must be at least twice that timeout
   * @param {number} options.purgeEveryMs how often expired records are purged, on a store that keeps them
   *   (one with `purgeExpired`: MemoryStore, PostgresStore); 0 never (default 60 000)
   * @param {string} options.component the component file (default `$IDEM_COMPONENT`, else the package's own idem-guard.wasm)
   * @param {object} options.guest the binding that runs it (default `Guest.load(component)` from idem-abi.js)
   * @param {object} options.logger `{ debug, info, warn, error }(message, fields)`: where the guard says what
   *   went wrong (store unavailable, response not recorded, renewal and purge failures) and, at
   *   debug, every decision (default: none)
   * @param {function} options.onDecision `(event)`: called once per `run` with what it came to (metrics)
   * @param {boolean|object} options.tracing OpenTelemetry spans: true (default: when `@opentelemetry/api` is
   *   installed and a tracer provider registered), false (never), or a Tracer to use
   */
  static load(options = {}) {
    return new Guard(options);
  }

  constructor({
    store = new MemoryStore(),
    clock = undefined,
    random = systemRandom,
    leaseMs = 30_000,
    retentionMs = 24 * 60 * 60 * 1000,
    maxResponseBytes = 1 << 20,
    renewLease = true,
    purgeEveryMs = 60_000,
    component = process.env.IDEM_COMPONENT || DEFAULT_COMPONENT,
    guest = Guest.load(component),
    logger = null,
    onDecision = null,
    tracing = true,
  } = {}) {
    if (!(Number.isInteger(purgeEveryMs) && purgeEveryMs >= 0)) {
      throw new RangeError(`purgeEveryMs ${purgeEveryMs} must be a whole number of milliseconds, 0 for never`);
    }
    const authority = clock ?? storeClock(store);
    if (typeof authority?.nowMs !== 'function') throw new TypeError('clock: expected { nowMs(): bigint }');
    // The lease must outlast a renewal in real time. A store that answers
    // from memory has no timeout to wait out, and a clock the caller gives
    // (a test's manual one) is not real time.
    if (renewLease && clock === undefined && typeof store.timeoutMs === 'number') checkLeaseRenewable(leaseMs, store.timeoutMs);
    this.store = store;
    this.clock = authority;
    this.policy = { leaseMs: BigInt(leaseMs), retentionMs: BigInt(retentionMs), maxResponseBytes };
    this.renewLease = renewLease;
    this.replaced = 0;
    this.#guest = guest;
    this.#store = store;
    this.#witness = new Witness(store);
    this.#authority = authority;
    this.#clock = { nowMs: () => BigInt(authority.nowMs()) };
    this.#random = random;
    /** Whether `begin`, `complete`, `release`, `renew`, `saveCheckpoint` and `beginRequest` return Promises. */
    this.async = isAsyncStore(store);
    if (this.async) this.#port = new JournalPort(this.#clock, random);
    if (onDecision !== null && typeof onDecision !== 'function') throw new TypeError('onDecision: expected a function (event) => void');
    this.#log = logWith(logger);
    this.#onDecision = onDecision;
    this.#tracing = new Tracing(tracing);
    this.#guard(); // fail at load, not at the first request, if the component is missing
    if (processLocal(store) && cluster.isWorker && !warnedLocal) {
      warnedLocal = true;
      process.emitWarning(
        'a Guard over MemoryStore in a node:cluster worker: each worker keeps its own keys, so a repeat that reaches another worker runs again. Use a shared store (RedisStore, PostgresStore).',
        { code: 'IDEM_PROCESS_LOCAL_STORE' },
      );
    }
    /** What the purge has done: `{ everyMs, runs, purged, errors, lastPurged, lastError }` (everyMs 0: no purge). */
    this.purgeStats = { everyMs: 0, runs: 0, purged: 0, errors: 0, lastPurged: 0, lastError: null };
    if (purgeEveryMs > 0 && typeof store.purgeExpired === 'function') this.#purger = new Purger(this, purgeEveryMs, this.#log);
  }

  /** Stops the guard's background work (the purge); calls still work, and `run` still renews its leases. */
  close() {
    this.#purger?.stop();
    this.#purger = null;
  }

  #guard() {
    if (!this.#instance) this.#instance = this.#instantiate();
    return this.#instance;
  }

  #instantiate() {
    const port = this.#port;
    return port ? this.#guest.instantiate(port, port, port) : this.#guest.instantiate(this.#witness, this.#clock, this.#random);
  }

  /** A trap drops the instance (it is never reused) and fails closed. */
  #trapped(e) {
    this.#instance = null;
    this.replaced += 1;
    return new GuardError('unavailable', `guard component failed, instance replaced: ${e?.message ?? e}`);
  }

  /**
   * Calls the component: over a synchronous store directly (the value, or a
   * thrown GuardError), else replayed until the store has answered every
   * call (a Promise). `finish(value, witness)` makes the call's result from
   * the export's value and what the call's Witness saw.
   */
  #call(call, finish = checked, span = null) {
    const why = this.#authority.unknown?.() ?? null;
    if (why !== null) return this.#closed(why);
    if (this.#port !== null) return this.#replayed(call, finish, span);
    const seen = this.#witness;
    seen.reset();
    try {
      return finish(this.#run(call), seen);
    } finally {
      seen.reset(); // it holds no response past the call
    }
  }

  /**
   * A call made before the store's clock is known (a server clock never
   * read): fails closed, thrown (a synchronous guard) or rejected (an
   * asynchronous one), without calling the component.
   */
  #closed(why) {
    const error = new GuardError('unavailable', `the store's clock is not known: ${why}`);
    if (this.#port !== null) return Promise.reject(error);
    throw error;
  }

  /** One run of an export: its value or `Failure`; a trap drops the instance and is thrown as GuardError. */
  #run(call) {
    const guard = this.#guard();
    try {
      return call(guard);
    } catch (e) {
      throw this.#trapped(e);
    }
  }

  #replayed(call, finish, span) {
    const traced = span === null ? null : (op, key) => span.storeCall(op, key);
    const seen = new Witness(this.#store); // one per call: calls over an asynchronous store overlap
    return replay(
      this.#port,
      seen,
      () => this.#run(call),
      (why) => new GuardError('unavailable', `replay diverged: ${why}`),
      (value) => finish(value, seen),
      traced,
    );
  }

  /**
   * `{ tag: 'proceed', val: claim } | { tag: 'replay', val: response, expiresAtMs } | { tag: 'in-flight', val: ms } | { tag: 'conflict' }`;
   * a replay's `expiresAtMs` (a BigInt, ms since the epoch on the store's clock) is the
   * `expiresAtMs` of the stored record it replays: until then repeats get this response.
   */
  begin(key, fingerprint, span = null) {
    return this.#call((g) => g.begin(key, fingerprint, this.policy), decided, span);
  }

  /**
   * Stores the response for the claim; returns (or resolves to) the stored
   * record's `expiresAtMs` (a BigInt, ms since the epoch on the store's
   * clock): until then every repeat replays it.
   */
  complete(claim, response, span = null) {
    const stored = toResponse(response); // once, not once per replayed run
    return this.#call((g) => g.complete(claim, stored, this.policy), storedUntil, span);
  }

  release(claim, span = null) {
    return this.#call((g) => g.release(claim), nothing, span);
  }

  /** Extends the claim's lease; returns the claim with its new fence. */
  renew(claim) {
    return this.#call((g) => g.renew(claim, this.policy));
  }

  /**
   * Records a recovery point `{ phase, data }` (data a string or bytes) for
   * the claim and extends its lease; returns the claim with its new fence
   * and this checkpoint. A later takeover's claim carries it.
   */
  saveCheckpoint(claim, { phase, data }) {
    const checkpoint = { phase, data: bytes(data) };
    return this.#call((g) => g.saveCheckpoint(claim, checkpoint, this.policy));
  }

  /** `begin` with the canonical fingerprint of `{ method, path, headers, body }`, in one call. */
  beginRequest(key, { method, path, headers = [], body }) {
    const parts = { method, path, headers: headers.map(([n, v]) => [n, bytes(v)]), body: bytes(body) };
    return this.#call((g) => g.beginRequest(key, parts, this.policy), decided);
  }

  /** The canonical fingerprint of `{ method, path, headers, body }`: synchronous with any store (no import is called). */
  fingerprint({ method, path, headers = [], body }) {
    const parts = { method, path, headers: headers.map(([n, v]) => [n, bytes(v)]), body: bytes(body) };
    return this.#run((g) => g.fingerprint(parts));
  }

  /**
   * Runs `handler(fence, attempt)` at most once per key and fingerprint
   * within the retention window and replays its response to every repeat.
   * `attempt` (an `Attempt`) holds the checkpoint to resume from — null on
   * a fresh claim, the last one saved when this run took over from an
   * attempt that crashed or failed — and `attempt.saveCheckpoint(phase,
   * data)` records the next. A handler that ignores it runs as before.
   *
   * While an async handler runs, its claim's lease is renewed every third of
   * the lease, so a handler slower than the lease is not taken over and run
   * a second time (`renewLease: false` turns this off). A renewal the store
   * cannot answer is tried again at the next tick; one refused as stale
   * (the claim was taken over) stops the renewing, and the completion is
   * then refused the same way. Renewals, checkpoints and the completion all
   * use the latest claim (each write moves the fence). A handler that blocks
   * the event loop blocks the renewals too.
   *
   * The handler is never run again because of what it returned: a value
   * the guard cannot keep (not a response, or over `maxResponseBytes`) is
   * not a reason to release the key. It stays claimed, as after a store
   * failure, and `run` rejects with a `NotRecordedError`; only a handler that
   * throws (or rejects) releases its key, for a retry.
   *
   * Resolves to `{ outcome: 'executed' | 'replayed', response, expiresAtMs }`
   * (`expiresAtMs`: the number of ms since the epoch, on the store's clock,
   * until which the key's stored response is replayed: the `expiresAtMs` of
   * its stored record), `{ outcome: 'in-flight', retryAfterMs }`, `{ outcome: 'conflict' }` or
   * `{ outcome: 'unavailable', message }` (the store failed: nothing ran).
   * Rejects with a `GuardError` of kind `invalid-input` for a bad key or
   * fingerprint, a `NotRecordedError` if the response could not be stored
   * (the key stays claimed until its lease runs out), or the handler's own
   * error (after releasing the claim).
   *
   * Observed when the guard has a `logger`, an `onDecision` callback, or an
   * OpenTelemetry tracer provider (`telemetry.js`); otherwise none of that
   * costs anything.
   */
  run(key, fingerprint, handler) {
    const tracer = this.#tracing.tracer();
    if (tracer === null && this.#onDecision === null && this.#log === null) {
      return this.async ? this.#runAsync(key, fingerprint, handler, null) : this.#runSync(key, fingerprint, handler, null);
    }
    return this.#runObserved(key, fingerprint, handler, tracer);
  }

  /**
   * `run` with its span, its log lines and its `onDecision` event: the same
   * bodies, told (through `seen`) the decision and the fence as they come.
   */
  async #runObserved(key, fingerprint, handler, tracer) {
    const started = performance.now();
    const seen = { span: tracer === null ? null : new RunSpan(tracer, key), decision: undefined, fence: undefined, handlerMs: undefined };
    let outcome;
    let result;
    let error;
    try {
      result = await (this.async ? this.#runAsync(key, fingerprint, handler, seen) : this.#runSync(key, fingerprint, handler, seen));
      outcome = result.outcome;
      return result;
    } catch (e) {
      error = e;
      outcome = thrownOutcome(e);
      throw e;
    } finally {
      const ms = performance.now() - started;
      const fields = { key, outcome, decision: seen.decision, ms };
      if (seen.fence !== undefined) fields.fence = seen.fence;
      if (seen.handlerMs !== undefined) fields.handlerMs = seen.handlerMs;
      if (outcome === 'in-flight') fields.retryAfterMs = result.retryAfterMs;
      if (outcome === 'unavailable') fields.reason = result.message;
      else if (error !== undefined) fields.reason = String(error?.message ?? error);
      this.#report(outcome, fields);
      if (seen.span !== null) {
        const span = seen.span;
        if (seen.decision !== undefined) span.set('idem.decision', seen.decision);
        if (seen.fence !== undefined) span.set('idem.fence', Number(seen.fence));
        span.set('idem.replayed', outcome === 'replayed');
        if (outcome === 'in-flight') span.set('idem.retry_after_ms', result.retryAfterMs);
        span.end(outcome, outcome === 'unavailable' ? new Error(result.message) : error);
      }
    }
  }

  /** The log line and the `onDecision` event of one `run`. */
  #report(outcome, fields) {
    const log = this.#log;
    if (log !== null) {
      switch (outcome) {
        case 'unavailable':
          log('warn', `idem: the store did not answer for ${fields.key}; nothing ran (fail closed)`, fields);
          break;
        case 'not-recorded':
          log('error', `idem: ${fields.key} ran but its response could not be recorded; the key stays claimed until its lease runs out`, fields);
          break;
        case 'failed':
          log('info', `idem: the handler for ${fields.key} threw; the key is released for a retry`, fields);
          break;
        default:
          log('debug', `idem: ${fields.key} ${outcome}`, fields);
      }
    }
    if (this.#onDecision !== null) {
      try {
        this.#onDecision(fields);
      } catch (e) {
        log?.('warn', 'idem: onDecision threw; ignored', { key: fields.key, reason: String(e?.message ?? e) });
      }
    }
  }

  /** `seen.decision` and `seen.fence` from a decision. */
  static #saw(seen, decision) {
    seen.decision = decision.tag;
    if (decision.tag === 'proceed') seen.fence = decision.val.fence;
  }

  /** The handler of an observed run, within its span when there is one (so its own spans are children), timed. */
  static async #handle(seen, handler, fence, attempt) {
    const started = performance.now();
    try {
      return await (seen.span === null ? handler(fence, attempt) : seen.span.within(handler, fence, attempt));
    } finally {
      seen.handlerMs = performance.now() - started;
    }
  }

  // Two bodies: the awaits of the asynchronous one, even untaken, made the
  // synchronous `run` a third slower (9.7 -> 13.1 µs a call, measured).
  // `seen` is null unless the run is observed (`#runObserved`).

  async #runSync(key, fingerprint, handler, seen) {
    let decision;
    try {
      decision = this.begin(key, fingerprint);
    } catch (e) {
      return unavailable(e);
    }
    if (seen !== null) Guard.#saw(seen, decision);
    if (decision.tag !== 'proceed') return notProceeding(decision);
    const held = this.#hold(decision.val);
    let value;
    try {
      const attempt = new Attempt(this, held);
      value = await (seen === null ? handler(held.claim.fence, attempt) : Guard.#handle(seen, handler, held.claim.fence, attempt));
    } catch (e) {
      held.stop();
      try {
        this.release(held.claim);
      } catch {
        // The lease runs out as after a crash.
      }
      throw e;
    }
    held.stop();
    // From here on the handler has run: nothing releases the key.
    let response;
    let expiresAtMs;
    try {
      response = responseOf(value);
      expiresAtMs = this.complete(held.claim, response);
    } catch (e) {
      throw new NotRecordedError(response, e, value);
    }
    return { outcome: 'executed', response, expiresAtMs: msNumber(expiresAtMs) };
  }

  /** `run` over an asynchronous store: each guard call awaited, and each write of the claim after the one in flight. */
  async #runAsync(key, fingerprint, handler, seen) {
    const span = seen?.span ?? null;
    let decision;
    try {
      decision = await this.begin(key, fingerprint, span);
    } catch (e) {
      return unavailable(e);
    }
    if (seen !== null) Guard.#saw(seen, decision);
    if (decision.tag !== 'proceed') return notProceeding(decision);
    const held = this.#hold(decision.val);
    let value;
    try {
      const attempt = new Attempt(this, held);
      value = await (seen === null ? handler(held.claim.fence, attempt) : Guard.#handle(seen, handler, held.claim.fence, attempt));
    } catch (e) {
      try {
        await held.stop();
        await this.release(held.claim, span);
      } catch {
        // The lease runs out as after a crash.
      }
      throw e;
    }
    // From here on the handler has run: nothing releases the key.
    let response;
    let expiresAtMs;
    try {
      const inFlight = held.stop();
      if (inFlight !== undefined) await inFlight; // a renewal in flight moves the fence the completion needs
      response = responseOf(value);
      expiresAtMs = await this.complete(held.claim, response, span);
    } catch (e) {
      throw new NotRecordedError(response, e, value);
    }
    return { outcome: 'executed', response, expiresAtMs: msNumber(expiresAtMs) };
  }

  /** Keeps renewing `claim`'s lease until `stop()`; `held.claim` is always the latest. */
  #hold(claim) {
    if (!this.renewLease) return new Held(claim, null, 0);
    this.#renewer ??= new Renewer(this, Math.max(1, Math.floor(Number(this.policy.leaseMs) / 3)), this.#log);
    return this.#renewer.hold(claim);
  }
}

/** Records one purge asks of a store at most; a period asks again until a batch comes back short. */
const PURGE_BATCH = 1_000;

/**
 * Frees the space of a guard's expired records every period: each run asks
 * the store for batches of PURGE_BATCH records expired at the run's start
 * until one comes back short. Reads never depend on it (every store treats
 * an expired record as absent), but without it a MemoryStore or a
 * PostgreSQL table grows with every key ever used; Redis expires its keys
 * itself, and RedisStore has no `purgeExpired`. A run still going when the
 * next is due is not doubled; a failed batch ends its run (counted in
 * `purgeStats.errors`, `lastError`) and the next period tries again. After
 * `close()` a run under way is not counted and none follows. The timer is
 * unref'd: it never keeps the process alive by itself, nor the guard.
 */
class Purger {
  /** Held weakly: a guard dropped without `close()` is not kept alive by its timer, which then stops. */
  #guard;
  #timer;
  #running = false;
  #stopped = false;
  #log;

  constructor(guard, everyMs, log) {
    this.#log = log;
    this.#guard = new WeakRef(guard);
    guard.purgeStats.everyMs = everyMs;
    this.#timer = setInterval(() => this.#run(), everyMs);
    this.#timer.unref();
  }

  stop() {
    clearInterval(this.#timer);
    this.#stopped = true;
  }

  async #run() {
    const guard = this.#guard.deref();
    if (guard === undefined) return this.stop();
    if (this.#running) return;
    // Purging by a guessed time could free live records: not until the store's clock is known.
    if ((guard.clock.unknown?.() ?? null) !== null) return;
    this.#running = true;
    const stats = guard.purgeStats;
    const store = guard.store;
    const now = BigInt(guard.clock.nowMs());
    let purged = 0;
    let error = null;
    try {
      for (;;) {
        const n = await store.purgeExpired(now, PURGE_BATCH);
        purged += n;
        if (n < PURGE_BATCH) break;
      }
    } catch (e) {
      error = e;
    } finally {
      this.#running = false;
    }
    if (this.#stopped) return; // close() freezes the stats, even mid-run
    stats.runs += 1;
    stats.purged += purged;
    stats.lastPurged = purged;
    if (error !== null) {
      stats.errors += 1;
      stats.lastError = error?.message ?? String(error);
      this.#log?.('warn', 'idem: purging expired records failed; the next period tries again', { reason: stats.lastError, purged });
    }
  }
}

/**
 * Renews the claims a guard's `run` holds, each a third of a lease after its
 * claim or last renewal, on one timer per guard armed for the earliest one
 * due: a handler that returns before its first renewal (the usual case)
 * costs a Set entry, not a timer of its own. All claims of a guard share one
 * interval, so a new claim is never due before the armed timer fires. Due
 * times are on the monotonic clock: a step of the wall clock neither stops
 * the renewals (a lease lapsing under a live holder) nor hurries them. The
 * timer is unref'd: it never keeps the process alive by itself.
 */
class Renewer {
  #guard;
  #every;
  #held = new Set();
  #timer = null;
  #log;

  constructor(guard, everyMs, log) {
    this.#guard = guard;
    this.#every = everyMs;
    this.#log = log;
  }

  hold(claim) {
    const held = new Held(claim, this.#held, this.#every);
    this.#held.add(held);
    if (!this.#timer) this.#arm(this.#every);
    return held;
  }

  #arm(ms) {
    this.#timer = setTimeout(() => this.#tick(), ms);
    this.#timer.unref();
  }

  #tick() {
    this.#timer = null;
    const now = monotonicMs();
    for (const held of [...this.#held]) {
      if (held.due > now) continue;
      held.due = now + this.#every;
      if (this.#guard.async) {
        this.#renewLater(held);
        continue;
      }
      try {
        held.claim = this.#guard.renew(held.claim);
      } catch (e) {
        this.#renewFailed(held, e);
      }
    }
    if (this.#held.size > 0) this.#arm(Math.max(1, Math.min(...Array.from(this.#held, (h) => h.due)) - now));
  }

  /** An asynchronous renewal, after the claim's write in flight (if any); none once the handler returned. */
  #renewLater(held) {
    held.serial(async () => {
      if (held.stopped) return;
      try {
        held.claim = await this.#guard.renew(held.claim);
      } catch (e) {
        this.#renewFailed(held, e);
      }
    });
  }

  #renewFailed(held, e) {
    // Unavailable: the lease may still hold, try at the next tick.
    const retried = e instanceof GuardError && e.kind === 'unavailable';
    if (!retried) this.#held.delete(held);
    this.#log?.('warn', `idem: renewing the lease of ${held.claim.key} failed${retried ? '; trying again at the next tick' : '; no more renewals'}`, {
      key: held.claim.key,
      fence: held.claim.fence,
      reason: String(e?.message ?? e),
    });
  }
}

/**
 * A claim `run` holds while its handler runs: `claim` is always the latest
 * (each renewal and checkpoint moves the fence). With renewal on, it sits in
 * its Renewer's set (`set`) and is renewed every `everyMs`.
 */
class Held {
  constructor(claim, set, everyMs) {
    this.claim = claim;
    this.set = set;
    this.everyMs = everyMs;
    this.due = set ? monotonicMs() + everyMs : 0;
    this.stopped = false;
    /** The last write of an asynchronous guard in flight for this claim (renewal or checkpoint), if any. */
    this.chain = undefined;
  }

  /** No more renewals; the write in flight, if any, to wait for before the claim's next write. */
  stop() {
    this.stopped = true;
    this.set?.delete(this);
    return this.chain;
  }

  /** A checkpoint moved the claim and extended the lease: the next renewal is a full interval away. */
  update(latest) {
    this.claim = latest;
    this.due = monotonicMs() + this.everyMs;
  }

  /**
   * Runs `write()` after the claim's previous asynchronous write has
   * settled, so renewals and checkpoints of one claim never overlap (each
   * goes on from the claim the one before returned). Its result or error is
   * `write`'s; the chain itself never rejects.
   */
  serial(write) {
    const done = (this.chain ?? Promise.resolve()).then(write);
    this.chain = done.then(
      () => undefined,
      () => undefined,
    );
    return done;
  }
}
