// What the stores on a server (RedisStore, PostgresStore, DynamoDbStore)
// share at run time: each extends `ServerStore`, which holds its time
// authority (a `SyncedClock` of its server, which the store starts at open
// with clock.js's `startSyncing` and stops at close) and the timeout of one
// call to the server. Each keeps its own connection, opening and primitives.
// Not an entry point of the package: its subclasses' modules are.
//
//   class EchoStore extends ServerStore {
//     constructor(timeoutMs) {
//       super("the echo server's clock", checkedTimeoutMs(timeoutMs));
//     }
//   }

import { SyncedClock } from './clock.js';

/**
 * The clock and the timeout of a store on a server, asynchronous (`async:
 * true`): a `Guard` over it replays each call from a journal and returns
 * Promises.
 */
export class ServerStore {
  /** Tells `Guard` that the primitives return Promises. */
  async = true;
  /** The server's clock, the store's time authority. */
  #clock;
  #timeoutMs;

  /**
   * @param {string} authority what the store's clock is, for operators ("the Redis server's clock (TIME)")
   * @param {number} timeoutMs how long one call to the server may take, checked (`checkedTimeoutMs`)
   * @param {object} clockOptions the `SyncedClock`'s options: its `resolutionMs`
   */
  constructor(authority, timeoutMs, clockOptions) {
    this.#clock = new SyncedClock(authority, clockOptions);
    this.#timeoutMs = timeoutMs;
  }

  /**
   * The store's time authority (wit/clock.wit): its server's clock (its
   * `authority` says which), kept synced while the store is open. A `Guard`
   * over the store uses it.
   */
  get clock() {
    return this.#clock;
  }

  /** How long one call to the server may take: a guard that renews its leases needs a lease of twice this at least. */
  get timeoutMs() {
    return this.#timeoutMs;
  }
}

/** `timeoutMs` checked: a positive whole number of milliseconds; a RangeError otherwise. */
export function checkedTimeoutMs(timeoutMs) {
  if (!(Number.isInteger(timeoutMs) && timeoutMs > 0)) throw new RangeError(`timeoutMs ${timeoutMs} must be a positive whole number of milliseconds`);
  return timeoutMs;
}
