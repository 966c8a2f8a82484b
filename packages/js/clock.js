// The time the guard judges leases and retention by: one *time authority*
// per store (wit/clock.wit), never this host's wall clock, which steps (an
// NTP correction, a VM resumed, a mis-set host) and disagrees with every
// other host's.
//
// - `SyncedClock`: a store server's clock (Redis `TIME` through the layout's
//   time.lua, PostgreSQL's `clock_timestamp()` through its `now`
//   statement), read when the store opens and every second after, and
//   carried between reads by this process's monotonic clock. Every host
//   reading the same server agrees with it to within its error bound (half
//   a round trip plus the drift since the read): RedisStore and
//   PostgresStore keep one (`store.clock`).
// - `localClock`: this process's monotonic clock, anchored once to the wall
//   clock; the authority of a store that lives and dies with the process
//   (MemoryStore).
// - `ManualClock`: one a test moves.
//
// A step of the wall clock (`Date.now()`) moves none of them; `wallOffsetMs`
// tells how far this host's wall clock is from a clock's time.
//
//   import { SyncedClock } from '@idem/guard';
//   const clock = new SyncedClock("a test server's clock");
//   clock.unknown(); // "a test server's clock has not been read yet": a guard on it fails closed
//   await clock.read(async () => 1_765_000_000_000); // the server's answer, in ms since the epoch
//   clock.nowMs(); // 1765000000000n, and on from there with the monotonic clock
//
// The monotonic clock is `performance.now()` (libuv's hrtime, Linux's
// CLOCK_MONOTONIC), in whole milliseconds as the layout's arithmetic takes
// them. Node has no boot clock (CLOCK_BOOTTIME, which the Rust host uses): a
// suspended machine's monotonic clock stands still meanwhile. A synced clock
// follows the server again at its next read (a disagreement beyond both
// error bounds is adopted), a second after the machine wakes at most; a
// local clock stays behind by the time suspended, as do the leases of the
// process it serves (which was suspended too).

/** This process's monotonic clock in whole milliseconds: never stepped. */
export function monotonicMs() {
  return Math.floor(performance.now());
}

/** How often a synced clock reads its server's clock again, unless its store is opened with `clockSyncMs`. */
export const SYNC_EVERY_MS = 1_000;

/** `clockSyncMs`'s range, as the Rust host's `clock_sync_ms`. */
export const SYNC_MIN_MS = 100;
export const SYNC_MAX_MS = 3_600_000;

/**
 * How fast the monotonic clock may drift from the server's, at most: a
 * millisecond every this many (100 ppm, which quartz oscillators stay well
 * inside). A reading's error bound grows by this as it ages.
 */
const DRIFT_EVERY_MS = 10_000;

/** Past this a disagreement between two readings is a step of the server's clock, counted in `steps`. */
const STEP_MS = 1_000;

/** `clockSyncMs` checked: a whole number of milliseconds from 100 to an hour; a RangeError naming the limit otherwise. */
export function checkedSyncMs(clockSyncMs) {
  if (!(Number.isInteger(clockSyncMs) && clockSyncMs >= SYNC_MIN_MS && clockSyncMs <= SYNC_MAX_MS)) {
    throw new RangeError(`clockSyncMs ${clockSyncMs} must be a whole number of milliseconds from ${SYNC_MIN_MS} to ${SYNC_MAX_MS}`);
  }
  return clockSyncMs;
}

/**
 * Starts a network store's clock: the first reading now, which must succeed
 * (a store whose server's clock cannot be read does not open: this throws
 * why, and a guard never runs on an unknown clock), then a reading with
 * `read` every `everyMs` while the store is open.
 */
export async function startSyncing(clock, everyMs, read) {
  await clock.read(read);
  const unknown = clock.unknown();
  if (unknown !== null) throw new Error(unknown);
  clock.keepSynced(everyMs, read);
}

/**
 * A store server's clock, kept on this host. `nowMs()` is the server's time
 * at the reading held plus the monotonic clock's time since, so a step of
 * this host's wall clock changes nothing and hosts reading the same server
 * agree to within the sum of their error bounds.
 *
 * A reading (wit/store-layout/README.md, "Time"): the server answered `S`
 * between monotonic instants `sent` and `received`, a round trip `rtt`; the
 * time at monotonic `m` is `S + (m - (sent + floor(rtt / 2)))`, and the
 * error bound `ceil(rtt / 2) + 1` ms plus 1 ms per 10 s since the read
 * (drift). A new reading is adopted only when it is more precise than the
 * one held (a smaller bound) or disagrees with it by more than both bounds
 * (the server's clock was set: the host follows it): round-trip jitter
 * never moves the time.
 *
 * Until its first reading the clock is unknown: `unknown()` says why, and a
 * guard on it fails every call closed (`unavailable`) rather than guess.
 */
export class SyncedClock {
  /** What the time is taken from, for operators ("the Redis server's clock (TIME)"). */
  authority;
  /** Server time minus the monotonic clock, ms (a Number: both are far below 2^53). */
  #offsetMs = 0;
  /** Half the held reading's round trip, rounded up, plus a millisecond. */
  #errorMs = Number.POSITIVE_INFINITY;
  /** The monotonic clock at the held reading. */
  #readAtMs = 0;
  #anchored = false;
  /** Why the last reading failed, while the clock was never anchored. */
  #lastFailure = null;
  #timer = null;
  #reading = false;
  /** Steps of the server's clock seen (a second or more), and the last one's size in ms (negative: back). */
  steps = 0;
  lastStepMs = 0;
  /** How fine the server's answers are: 1 ms, or 1 000 for an HTTP `Date` header (DynamoDB's). */
  #resolutionMs;

  /**
   * @param {string} authority what the time is taken from, for operators
   * @param {object} options
   * @param {number} options.resolutionMs the server answers in whole steps of this, floored (default 1):
   *   a reading is the middle of its step, and its error bound grows by half of it
   */
  constructor(authority, { resolutionMs = 1 } = {}) {
    this.authority = String(authority);
    if (!(Number.isInteger(resolutionMs) && resolutionMs >= 1))
      throw new RangeError(`resolutionMs ${resolutionMs} must be a whole number of milliseconds, at least 1`);
    this.#resolutionMs = resolutionMs;
  }

  /**
   * Takes one reading: `read()` resolves to the server's time in
   * milliseconds since the Unix epoch (a number or a bigint). A failure
   * leaves the time as it was (and, before the first reading, says why in
   * `unknown()`); it never rejects.
   */
  async read(read) {
    const sent = monotonicMs();
    let serverMs;
    try {
      serverMs = Number(await read());
      if (!Number.isSafeInteger(serverMs) || serverMs < 0) throw new RangeError(`the server's time ${serverMs} is not milliseconds since the epoch`);
    } catch (e) {
      if (!this.#anchored) this.#lastFailure = `reading it failed: ${e?.message ?? e}`;
      return;
    }
    this.adopt(serverMs, sent, monotonicMs());
  }

  /**
   * Reads the server's clock with `read` every `everyMs` (the first time one
   * period from now), one read at a time, until `stop()`. The timer is
   * unref'd: it never keeps the process alive by itself.
   */
  keepSynced(everyMs, read) {
    this.stop();
    this.#timer = setInterval(async () => {
      if (this.#reading) return;
      this.#reading = true;
      try {
        await this.read(read);
      } finally {
        this.#reading = false;
      }
    }, everyMs);
    this.#timer.unref();
  }

  /** No more reads; the clock keeps answering from the reading it holds. */
  stop() {
    if (this.#timer !== null) clearInterval(this.#timer);
    this.#timer = null;
  }

  /** A reading: the server said `serverMs` between the monotonic instants `sentMs` and `receivedMs` (all in ms). */
  adopt(serverMs, sentMs, receivedMs) {
    const roundTrip = Math.max(0, receivedMs - sentMs);
    const halfStep = Math.floor(this.#resolutionMs / 2);
    const offset = serverMs + halfStep - (sentMs + Math.floor(roundTrip / 2));
    const error = Math.ceil(roundTrip / 2) + halfStep + 1;
    if (this.#anchored) {
      const apart = Math.abs(offset - this.#offsetMs);
      const heldError = this.errorAt(receivedMs);
      const disagrees = apart > heldError + error;
      if (!disagrees && error >= heldError) return; // no better, and consistent with what is held
      if (disagrees && apart >= STEP_MS) {
        this.steps += 1;
        this.lastStepMs = offset - this.#offsetMs;
      }
    }
    this.#offsetMs = offset;
    this.#errorMs = error;
    this.#readAtMs = receivedMs;
    this.#anchored = true;
    this.#lastFailure = null;
  }

  /** The time at monotonic instant `atMs`, in ms since the epoch (a Number). */
  at(atMs) {
    return Math.max(0, atMs + this.#offsetMs);
  }

  /** The held reading's error bound at monotonic instant `atMs`: its round trip's, grown by the drift since. */
  errorAt(atMs) {
    return this.#errorMs + Math.ceil(Math.max(0, atMs - this.#readAtMs) / DRIFT_EVERY_MS);
  }

  nowMs() {
    return BigInt(this.at(monotonicMs()));
  }

  /** The bound on `nowMs()`'s error in ms, or null while the clock was never read. */
  errorMs() {
    return this.#anchored ? this.errorAt(monotonicMs()) : null;
  }

  /** Why the clock does not know its server's time (never read yet), or null once it does. */
  unknown() {
    if (this.#anchored) return null;
    return `${this.authority} has not been read yet${this.#lastFailure === null ? '' : ` (${this.#lastFailure})`}`;
  }
}

/** The wall-clock instant and the monotonic clock at the local clock's anchor: set at its first read. */
let anchor = null;

/**
 * This process's monotonic clock, anchored to the wall clock the first time
 * it is read: the authority of a store that lives and dies with the
 * process (MemoryStore). Every reader in the process gets the same time.
 */
export const localClock = {
  authority: "this process's monotonic clock, anchored to its wall clock once",
  nowMs() {
    anchor ??= { wallMs: Date.now(), monotonicMs: monotonicMs() };
    return BigInt(anchor.wallMs + (monotonicMs() - anchor.monotonicMs));
  },
  errorMs() {
    return 0;
  },
  unknown() {
    return null;
  },
};

/** A clock that moves only when told to: tests expire leases without sleeping. */
export class ManualClock {
  authority = 'a manual clock';

  constructor(ms) {
    this.ms = BigInt(ms);
  }
  nowMs() {
    return this.ms;
  }
  set(ms) {
    this.ms = BigInt(ms);
  }
  advance(ms) {
    this.ms += BigInt(ms);
  }
}

/**
 * How far this host's wall clock is ahead of `clock` (negative: behind), in
 * ms: a wall-clock step, or a mis-set host, shows here. For operators; the
 * guard never uses the wall clock.
 */
export function wallOffsetMs(clock) {
  return Date.now() - Number(clock.nowMs());
}

/** A Redis `TIME` reply (`[seconds, microseconds]`, as decimal strings or bytes) in ms since the epoch (wit/store-layout/README.md). */
export function redisTimeMs(reply) {
  if (!Array.isArray(reply) || reply.length !== 2) throw new TypeError(`expected TIME's [seconds, microseconds], got ${describe(reply)}`);
  const [seconds, micros] = reply.map((part) => {
    const text = String(part);
    if (!/^[0-9]{1,20}$/.test(text)) throw new TypeError(`TIME answered ${JSON.stringify(text)}, not a whole number`);
    return BigInt(text);
  });
  return seconds * 1000n + micros / 1000n;
}

function describe(value) {
  try {
    return JSON.stringify(value);
  } catch {
    return typeof value;
  }
}
