// Types of @idem/guard (index.js). Values follow jco's conventions for the
// WIT `idem:guard@0.3.0`: u64 is a bigint, `option<T>` is `undefined` or T,
// a variant is `{ tag, val }`, records have camelCase fields, `list<u8>` is a
// Uint8Array. Over a synchronous store (`Store`, e.g. MemoryStore) the guard's
// calls answer at once; over an asynchronous one (`AsyncStore`, e.g.
// RedisStore from '@idem/guard/redis') `Guard.load` returns an `AsyncGuard`,
// whose calls return Promises. test/install.test.js type-checks a user's program against this
// file and checks that it names every export of index.js.

/** Bytes: a string is encoded as UTF-8; absent is empty. */
export type BytesInit = string | Uint8Array;

/** A response as the guard stores and replays it: status, headers in order, body bytes. */
export interface Response {
  status: number;
  headers: [name: string, value: Uint8Array][];
  body: Uint8Array;
}

/** A response as a handler returns it. */
export interface ResponseInit {
  status: number;
  headers?: [name: string, value: BytesInit][];
  body?: BytesInit | null;
}

/** A recovery point: how far an attempt got (`phase`, 1 to 64 bytes) and what to continue from. */
export interface Checkpoint {
  phase: string;
  data: Uint8Array;
}

/** The right to run the handler for one key; each renewal and checkpoint moves its fence. */
export interface Claim {
  key: string;
  fingerprint: string;
  fence: bigint;
  holder: bigint;
  leaseUntilMs: bigint;
  expiresAtMs: bigint;
  checkpoint?: Checkpoint;
}

/**
 * What `begin` decides. `in-flight` carries the milliseconds until the
 * holder's lease runs out; `replay` the stored response and `expiresAtMs`,
 * its record's expiry (ms since the epoch on the store's clock): repeats get
 * this response until then.
 */
export type Decision =
  | { tag: 'proceed'; val: Claim }
  | { tag: 'replay'; val: Response; expiresAtMs: bigint }
  | { tag: 'in-flight'; val: bigint }
  | { tag: 'conflict'; val?: undefined };

/**
 * What `run` resolves to. `expiresAtMs`, for a response that is stored (the
 * first and every replay): the number of ms since the epoch, on the store's
 * clock, until which the key replays it (its stored record's `expiresAtMs`).
 */
export type RunResult =
  | { outcome: 'executed'; response: Response; expiresAtMs: number }
  | { outcome: 'replayed'; response: Response; expiresAtMs: number }
  | { outcome: 'in-flight'; retryAfterMs: number }
  | { outcome: 'conflict' }
  | { outcome: 'unavailable'; message: string };

export type Outcome = RunResult['outcome'];

/** A request, for its canonical fingerprint (wit/guard.wit). */
export interface RequestParts {
  method: string;
  path: string;
  headers?: [name: string, value: BytesInit][];
  body?: BytesInit | null;
}

/** The guard's policy, as `Guard.load` sets it from its options. */
export interface Policy {
  leaseMs: bigint;
  retentionMs: bigint;
  maxResponseBytes: number;
}

export type GuardErrorKind = 'unavailable' | 'invalid-input' | 'stale-claim';
export type StoreErrorKind = 'unavailable' | 'corrupt';

/**
 * A stored record: wit/types.wit's `record`, with the response stored beside
 * it (present exactly when `state` is `done`) as every store's layout keeps
 * it. The response a store is handed in `replace` is the caller's own (the
 * one given to `complete`), and the one it returns is what a replay hands
 * the caller: a store keeps bytes of its own.
 */
export interface StoredRecord {
  fingerprint: string;
  state: 'processing' | 'done';
  holder: bigint;
  leaseUntilMs: bigint;
  expiresAtMs: bigint;
  response?: Response;
  checkpoint?: Checkpoint;
}

export interface Entry {
  record: StoredRecord;
  version: bigint;
}

export type InsertOutcome = { tag: 'inserted'; val: bigint } | { tag: 'existing'; val: Entry };

/**
 * What every store says about itself beside its primitives: its time
 * authority, and whether its records live in this process only.
 */
export interface StoreTraits {
  /**
   * The store's time authority (wit/clock.wit), which a `Guard` over it
   * judges leases and retention by unless given a `clock`: for a store
   * several hosts share, its server's clock (a `SyncedClock`). A store
   * without one must be `processLocal` (it then gets `localClock`), or every
   * guard over it must be given a clock.
   */
  readonly clock?: Clock;
  /** Its records live in this process only (as MemoryStore's). */
  readonly processLocal?: boolean;
  /**
   * How long one store call may take before it fails: a guard that renews
   * its leases (`renewLease`, the default) on the store's own clock refuses
   * a lease shorter than twice this (`checkLeaseRenewable`).
   */
  readonly timeoutMs?: number;
}

/**
 * The store primitives of wit/store.wit. A failure the guard should see is
 * thrown as a value with an own `payload` (`StoreError`); anything else
 * thrown is a host bug and traps the instance (the call fails closed).
 */
export interface Store extends StoreTraits {
  /** The live record for `key`, or undefined when absent or expired at `nowMs`. */
  get(key: string, nowMs: bigint): Entry | undefined;
  /** Inserts unless a live record exists (then returns it). */
  insert(key: string, record: StoredRecord, nowMs: bigint): InsertOutcome;
  /**
   * Writes the record at `expectedVersion + 1` if the live record is at
   * `expectedVersion`: whether it did (contract 0.3; it returned the new
   * version before).
   */
  replace(key: string, expectedVersion: bigint, record: StoredRecord, nowMs: bigint): boolean;
  /** Removes the record live at `nowMs`, only at `expectedVersion` when given: whether it did. For operators; the guard never calls it. */
  delete?(key: string, expectedVersion: bigint | undefined, nowMs: bigint): boolean;
  /** Frees at most `limit` records expired at `nowMs`, returning how many: a guard calls it every `purgeEveryMs`. */
  purgeExpired?(nowMs: bigint, limit: number): number;
}

/**
 * The store primitives of wit/store.wit answered in a later turn of the
 * event loop (a network client): `async: true` tells the guard, which then
 * replays each call from a journal of the answers (journal.js) and
 * returns Promises. Failures as for `Store`: a rejected `StoreError` reaches
 * the guard as `store-error`, anything else traps the instance.
 */
export interface AsyncStore extends StoreTraits {
  readonly async: true;
  get(key: string, nowMs: bigint): Promise<Entry | undefined>;
  insert(key: string, record: StoredRecord, nowMs: bigint): Promise<InsertOutcome>;
  replace(key: string, expectedVersion: bigint, record: StoredRecord, nowMs: bigint): Promise<boolean>;
  delete?(key: string, expectedVersion: bigint | undefined, nowMs: bigint): Promise<boolean>;
  /** As `Store.purgeExpired`. */
  purgeExpired?(nowMs: bigint, limit: number): Promise<number>;
}

/**
 * A time authority (wit/clock.wit): milliseconds since the Unix epoch as
 * every host sharing the store sees them.
 */
export interface Clock {
  nowMs(): bigint | number;
  /**
   * Why the clock does not know its authority's time yet (a server clock
   * never read), or null once it does: meanwhile a guard on it fails every
   * call but `fingerprint` closed. A clock without it is always known.
   */
  unknown?(): string | null;
  /** The bound on `nowMs()`'s error in ms (0 for a local clock), or null while unknown. */
  errorMs?(): number | null;
  /** What the time is taken from, for operators. */
  readonly authority?: string;
}

export interface Random {
  randomU64(): bigint;
}

/** What a `run` came to, as `onDecision` and the logger's fields give it. */
export type RunOutcome = Outcome | 'failed' | 'not-recorded' | 'invalid-input';

/**
 * One `run`, as `onDecision` is told it (and the logger's fields): the key;
 * what it came to (`failed`: the handler threw and the key was released;
 * `not-recorded`: the handler ran but its response was not stored — the key
 * stays claimed until its lease runs out; `invalid-input`: a bad key or
 * fingerprint); `begin`'s decision when it made one; the claim's fence when
 * it proceeded; milliseconds for the whole call and for the handler; why,
 * for `unavailable`, `failed` and `not-recorded` (the store's own words:
 * for logs and metrics, not for clients).
 */
export interface DecisionEvent {
  key: string;
  outcome: RunOutcome;
  decision: Decision['tag'] | undefined;
  fence?: bigint;
  ms: number;
  handlerMs?: number;
  retryAfterMs?: number;
  reason?: string;
}

/**
 * Where a guard writes what went wrong and, at `debug`, every decision:
 * console and winston fit as they are (`(message, fields)`); pino through
 * `{ warn: (m, f) => log.warn(f, m), … }`. A missing level is dropped.
 */
export interface Logger {
  debug?(message: string, fields: object): void;
  info?(message: string, fields: object): void;
  warn?(message: string, fields: object): void;
  error?(message: string, fields: object): void;
}

/** An OpenTelemetry `Tracer` (from `@opentelemetry/api`), as much of it as the guard calls. */
export interface TracerLike {
  startSpan(
    name: string,
    options?: object,
    context?: unknown,
  ): {
    setAttribute(key: string, value: string | number | boolean): unknown;
    setStatus(status: { code: number; message?: string }): unknown;
    recordException(exception: Error): unknown;
    end(): void;
  };
}

/** A binding that runs the component (default: the package's own, over its core module). */
export interface GuestBinding {
  instantiate(store: Store, clock: { nowMs(): bigint }, random: Random): unknown;
}

export interface GuardOptions {
  /** The store primitives (default: a new MemoryStore). */
  store?: Store;
  /**
   * The time leases and retention are judged by. Default: the store's time
   * authority (`store.clock`): the server's clock for RedisStore and
   * PostgresStore, this process's monotonic clock for MemoryStore; never
   * the wall clock. For tests, a `ManualClock`.
   */
  clock?: Clock;
  /** The claims' holder ids (default: the system's CSPRNG). */
  random?: Random;
  /** How long a claim is held (default 30 000). */
  leaseMs?: number | bigint;
  /** How long keys are remembered (default 24 h). */
  retentionMs?: number | bigint;
  /** The largest stored response, and checkpoint data (default 1 MiB). */
  maxResponseBytes?: number;
  /**
   * Whether `run` renews the claim's lease while its handler runs (default
   * true). With it, over a store with a `timeoutMs` and on the store's own
   * clock, `leaseMs` must be at least twice that timeout.
   */
  renewLease?: boolean;
  /**
   * How often expired records are purged, in batches of 1 000 until one comes back short, on a store
   * that keeps them (one with `purgeExpired`: MemoryStore, PostgresStore; Redis expires keys itself);
   * 0 never (default 60 000). The timer never keeps the process alive; `close()` stops it.
   */
  purgeEveryMs?: number;
  /** The component file (default `$IDEM_COMPONENT`, else the package's own idem-guard.wasm). */
  component?: string;
  /** The binding that runs it (default: the package's lean canonical-ABI binding). */
  guest?: GuestBinding;
  /**
   * Where the guard says what went wrong — the store unavailable (warn), a
   * response not recorded (error), a handler that threw (info), renewal and
   * purge failures (warn) — and every decision (debug). Default: none.
   */
  logger?: Logger | null;
  /** Called once per `run` with what it came to (for metrics); what it throws is ignored. */
  onDecision?: ((event: DecisionEvent) => void) | null;
  /**
   * OpenTelemetry spans, one `idem.run` per `run` (and one child per store
   * call over an asynchronous store): `true` (default) uses the global
   * tracer provider of `@opentelemetry/api` when it is installed and one is
   * registered, and costs nothing otherwise; `false` never; or the Tracer to use.
   */
  tracing?: boolean | TracerLike;
}

/** `GuardOptions` with an asynchronous store: `Guard.load` returns an `AsyncGuard`. */
export type AsyncGuardOptions = Omit<GuardOptions, 'store'> & { store: AsyncStore };

/** What `run` hands its handler beside the fence. */
export declare class Attempt {
  private constructor();
  /** The claim as it stands: renewals and checkpoints move its fence. */
  get claim(): Claim;
  get fence(): bigint;
  /** The key's last recovery point, or null on a fresh claim. */
  get checkpoint(): Checkpoint | null;
  /** Records a recovery point and extends the lease; returns the new claim. Throws `GuardError`. */
  saveCheckpoint(phase: string, data?: BytesInit): Claim;
}

export type Handler = (fence: bigint, attempt: Attempt) => ResponseInit | Promise<ResponseInit>;

/** What an `AsyncGuard`'s `run` hands its handler: `saveCheckpoint` returns a Promise. */
export interface AsyncAttempt {
  readonly claim: Claim;
  readonly fence: bigint;
  /** The key's last recovery point, or null on a fresh claim. */
  readonly checkpoint: Checkpoint | null;
  /** Records a recovery point and extends the lease; resolves to the new claim. Rejects with `GuardError`. */
  saveCheckpoint(phase: string, data?: BytesInit): Promise<Claim>;
}

export type AsyncHandler = (fence: bigint, attempt: AsyncAttempt) => ResponseInit | Promise<ResponseInit>;

/** What a guard's purge has done: `everyMs` 0 when it does not purge (its store keeps no expired records, or `purgeEveryMs: 0`). */
export interface PurgeStats {
  everyMs: number;
  runs: number;
  purged: number;
  errors: number;
  /** Records the last run freed. */
  lastPurged: number;
  /** Why the last failed run failed, or null. */
  lastError: string | null;
}

/** What `Guard` and `AsyncGuard` share. */
export interface GuardCommon {
  readonly clock: Clock;
  readonly policy: Policy;
  renewLease: boolean;
  /** How many trapped instances were replaced. */
  readonly replaced: number;
  /** What the purge has done so far. */
  readonly purgeStats: PurgeStats;
  /** Stops the guard's background work (the purge); calls still work. */
  close(): void;
  /** The canonical fingerprint of a request: calls no store, so synchronous with any. */
  fingerprint(parts: RequestParts): string;
}

/** The guard over a synchronous store: every call answers at once. */
export interface Guard extends GuardCommon {
  readonly async: false;
  readonly store: Store;

  /** Claims `key` for `fingerprint`, or says why not. Throws `GuardError`. */
  begin(key: string, fingerprint: string): Decision;
  /**
   * Stores the response for the claim's key: every repeat replays it until
   * the instant returned, the stored record's `expiresAtMs` (ms since the
   * epoch on the store's clock). Throws `GuardError`.
   */
  complete(claim: Claim, response: ResponseInit): bigint;
  /** Gives the key up (the checkpoint is kept): the next `begin` takes it over. Throws `GuardError`. */
  release(claim: Claim): void;
  /** Extends the claim's lease; returns the claim with its new fence. Throws `GuardError`. */
  renew(claim: Claim): Claim;
  /** Records a recovery point and extends the lease; returns the new claim. Throws `GuardError`. */
  saveCheckpoint(claim: Claim, checkpoint: { phase: string; data?: BytesInit }): Claim;
  /** `begin` with the request's canonical fingerprint, in one call. */
  beginRequest(key: string, parts: RequestParts): Decision;
  /**
   * Runs `handler` at most once per key and fingerprint within the retention
   * window and replays its response to every repeat. Rejects with a
   * `GuardError` (`invalid-input`), a `NotRecordedError`, or the handler's
   * own error (after releasing the claim).
   */
  run(key: string, fingerprint: string, handler: Handler): Promise<RunResult>;
}

/**
 * The guard over an asynchronous store (`AsyncStore`): the same calls as
 * `Guard`, each resolving to what `Guard`'s returns, or rejecting with what
 * it throws. Each call runs the component again for every store answer it
 * needs (journal.js); the store sees each primitive once, in the order a
 * synchronous store would. `fingerprint` calls no store and stays synchronous.
 */
export interface AsyncGuard extends GuardCommon {
  readonly async: true;
  readonly store: AsyncStore;

  begin(key: string, fingerprint: string): Promise<Decision>;
  complete(claim: Claim, response: ResponseInit): Promise<bigint>;
  release(claim: Claim): Promise<void>;
  renew(claim: Claim): Promise<Claim>;
  saveCheckpoint(claim: Claim, checkpoint: { phase: string; data?: BytesInit }): Promise<Claim>;
  beginRequest(key: string, parts: RequestParts): Promise<Decision>;
  /** As `Guard.run`; the handler's `attempt.saveCheckpoint` returns a Promise. */
  run(key: string, fingerprint: string, handler: AsyncHandler): Promise<RunResult>;
}

/** `Guard.load(options)` and `new Guard(options)`: an `AsyncGuard` when the store is an `AsyncStore`. */
export interface GuardConstructor {
  new (options: AsyncGuardOptions): AsyncGuard;
  new (options?: GuardOptions): Guard;
  load(options: AsyncGuardOptions): AsyncGuard;
  load(options?: GuardOptions): Guard;
  readonly prototype: Guard | AsyncGuard;
}

export declare const Guard: GuardConstructor;

/** An error the guard returned. */
export declare class GuardError extends Error {
  constructor(kind: GuardErrorKind, message: string);
  readonly name: 'GuardError';
  readonly kind: GuardErrorKind;
  readonly detail: string;
}

/**
 * The handler ran but its response could not be stored: the store failed,
 * the claim was taken over, or what it returned cannot be kept (over
 * `maxResponseBytes`, or not a response: then `error` is a `GuardError`
 * `invalid-input` and `response` undefined). The key is never released for
 * it: a retry runs the handler again only after the lease has run out.
 */
export declare class NotRecordedError extends Error {
  constructor(response: Response | undefined, error: Error, value?: unknown);
  readonly name: 'NotRecordedError';
  readonly response: Response | undefined;
  readonly error: Error;
  /** What the handler returned. */
  readonly value: unknown;
}

/** A store failure as the guard sees it: thrown from a store function, the guard fails closed. */
export declare class StoreError extends Error {
  constructor(kind: StoreErrorKind, message: string);
  readonly name: 'StoreError';
  readonly payload: { tag: StoreErrorKind; val: string };
}

export type FaultRule = { kind: 'error' | 'lost' | 'trap'; message?: string; count?: number };

/** The store primitives over a Map, with fault injection for tests. */
export declare class MemoryStore implements Store {
  /** Its time authority: this process's monotonic clock (`localClock`). */
  readonly clock: Clock;
  get(key: string, nowMs: bigint): Entry | undefined;
  insert(key: string, record: StoredRecord, nowMs: bigint): InsertOutcome;
  replace(key: string, expectedVersion: bigint, record: StoredRecord, nowMs: bigint): boolean;
  /** Removes the record live at `nowMs` (default: now by its clock), only at `expectedVersion` when given. */
  delete(key: string, expectedVersion?: bigint, nowMs?: bigint | number): boolean;
  /** `error` fails before applying, `lost` applies then fails, `trap` throws a plain Error. */
  fault(primitive: 'get' | 'insert' | 'replace' | 'delete', rule: FaultRule): void;
  clearFaults(): void;
  /** The live record for `key`, bypassing faults. */
  peek(key: string, nowMs: number | bigint): Entry | undefined;
  /** How many records it holds, expired ones not yet purged included. */
  readonly size: number;
  /** Frees at most `limit` records expired at `nowMs`; returns how many. */
  purgeExpired(nowMs: number | bigint, limit: number): number;
}

/** A clock that moves only when told to. */
export declare class ManualClock implements Clock {
  constructor(ms: number | bigint);
  readonly authority: string;
  ms: bigint;
  nowMs(): bigint;
  set(ms: number | bigint): void;
  advance(ms: number | bigint): void;
}

/**
 * A store server's clock kept on this host: read (`read`) at the store's
 * open and every second after (`keepSynced`), carried between reads by the
 * process's monotonic clock; unknown until the first reading. A reading is
 * adopted when more precise than the one held, or when it disagrees beyond
 * both error bounds (wit/store-layout/README.md, "Time").
 */
export declare class SyncedClock implements Clock {
  /** `resolutionMs`: the server answers in whole steps of this, floored (default 1; 1 000 for an HTTP `Date` header): a reading is the middle of its step, its error bound half a step more. */
  constructor(authority: string, options?: { resolutionMs?: number });
  readonly authority: string;
  /** Steps of the server's clock seen (a second or more), and the last one's size in ms (negative: back). */
  readonly steps: number;
  readonly lastStepMs: number;
  /** One reading: `read()` resolves to the server's time in ms since the epoch. Never rejects: a failure keeps the time as it was. */
  read(read: () => Promise<bigint | number> | bigint | number): Promise<void>;
  /** Reads again every `everyMs` until `stop()`; the timer never keeps the process alive. */
  keepSynced(everyMs: number, read: () => Promise<bigint | number> | bigint | number): void;
  stop(): void;
  /** A reading: the server said `serverMs` between the monotonic instants `sentMs` and `receivedMs`. */
  adopt(serverMs: number, sentMs: number, receivedMs: number): void;
  /** The time at monotonic instant `atMs`. */
  at(atMs: number): number;
  /** The error bound at monotonic instant `atMs`. */
  errorAt(atMs: number): number;
  nowMs(): bigint;
  errorMs(): number | null;
  unknown(): string | null;
}

/** This process's monotonic clock, anchored to its wall clock once: MemoryStore's time authority. */
export declare const localClock: Clock & { nowMs(): bigint; errorMs(): number; unknown(): null; readonly authority: string };

/** How far this host's wall clock is ahead of `clock`'s time (negative: behind), in ms: for operators. */
export declare function wallOffsetMs(clock: Clock): number;

/**
 * Throws a RangeError when a lease of `leaseMs` could lapse while its holder
 * is renewing it on a store that may take `storeTimeoutMs` to answer: the
 * lease must be at least twice the store's timeout (as the Rust host's
 * `check_lease_renewable`). `Guard.load` checks it when it renews leases.
 */
export declare function checkLeaseRenewable(leaseMs: number | bigint, storeTimeoutMs: number): void;

/** 64 random bits per call from the system's CSPRNG. */
export declare const systemRandom: Random;

/** A response as the component stores it. */
export declare function toResponse(response: ResponseInit): Response;

/**
 * Whether a store keeps its records in this process only (a MemoryStore, or
 * a store that says `processLocal: true`): a guard over it in a
 * `node:cluster` worker warns (`IDEM_PROCESS_LOCAL_STORE`), and the Express
 * middleware refuses it there.
 */
export declare function processLocal(store: Store | AsyncStore): boolean;

/**
 * The canonical fingerprint of `wit/guard.wit` (`sha256:` and 64 hex
 * digits), computed natively: equal to `guard.fingerprint(request)`
 * without passing the request into the component.
 */
export declare function fingerprint(request: RequestParts): string;
