// Types of server-store.js: what @idem/guard/redis, /postgres and /dynamodb
// declare alike. A store on a server, in the shared on-store layout
// (wit/store-layout/README.md), whose time authority is that server's clock:
// each of RedisStore, PostgresStore and DynamoDbStore extends `ServerStore`
// (`async`, the clock, the timeout: the class, at run time) and adds its
// opening, options and own members. The interface of the same name declares
// the primitives every one of them has.

import type { AsyncStore, Entry, InsertOutcome, StoredRecord, SyncedClock } from './index.js';

/** The store primitives on a server; a `Guard` over one is an `AsyncGuard`. */
export interface ServerStore extends AsyncStore {
  get(key: string, nowMs: bigint): Promise<Entry | undefined>;
  insert(key: string, record: StoredRecord, nowMs: bigint): Promise<InsertOutcome>;
  replace(key: string, expectedVersion: bigint, record: StoredRecord, nowMs: bigint): Promise<boolean>;
  /** Removes the record live at `nowMs` (default: now by the store's clock), only at `expectedVersion` when given. */
  delete(key: string, expectedVersion?: bigint, nowMs?: bigint | number): Promise<boolean>;
  /** Stops reading the server's clock and closes the store's connections. */
  close(): Promise<void>;
}

/** What every store on a server holds: its server's clock and the timeout of one call. */
export declare class ServerStore {
  readonly async: true;
  /** The store's time authority (wit/clock.wit): its server's clock (each store's page says which), kept synced while the store is open. */
  readonly clock: SyncedClock;
  /** How long one call to the server may take before it fails as unavailable (the `timeoutMs` it was opened with). */
  readonly timeoutMs: number;
  protected constructor(authority: string, timeoutMs: number, clockOptions?: { resolutionMs?: number });
}

/** `timeoutMs` checked: a positive whole number of milliseconds; a RangeError otherwise. */
export declare function checkedTimeoutMs(timeoutMs: number): number;
