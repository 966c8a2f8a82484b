// What @idem/guard/redis, /postgres and /dynamodb declare alike: a store on a
// server, in the shared on-store layout (wit/store-layout/README.md), whose
// time authority is that server's clock. Each of RedisStore, PostgresStore
// and DynamoDbStore is a class of its own (no common base at run time): its
// declaration merges this interface in (`interface RedisStore extends
// ServerStore {}`) and adds its opening, options and own members.

import type { AsyncStore, Entry, InsertOutcome, StoredRecord, SyncedClock } from './index.js';

/** The store primitives on a server; a `Guard` over one is an `AsyncGuard`. */
export interface ServerStore extends AsyncStore {
  readonly async: true;
  /** The store's time authority (wit/clock.wit): its server's clock (each store's page says which), kept synced while the store is open. */
  readonly clock: SyncedClock;
  /** How long one call to the server may take before it fails as unavailable (the `timeoutMs` it was opened with). */
  readonly timeoutMs: number;
  get(key: string, nowMs: bigint): Promise<Entry | undefined>;
  insert(key: string, record: StoredRecord, nowMs: bigint): Promise<InsertOutcome>;
  replace(key: string, expectedVersion: bigint, record: StoredRecord, nowMs: bigint): Promise<boolean>;
  /** Removes the record live at `nowMs` (default: now by the store's clock), only at `expectedVersion` when given. */
  delete(key: string, expectedVersion?: bigint, nowMs?: bigint | number): Promise<boolean>;
  /** Stops reading the server's clock and closes the store's connections. */
  close(): Promise<void>;
}
