// Types of @idem/guard/dynamodb (dynamodb.js): the store primitives on
// DynamoDB in the shared on-store layout (wit/store-layout/README.md).
// Needs the optional peer dependency `@aws-sdk/client-dynamodb`.

import type { AsyncStore, Entry, InsertOutcome, StoredRecord, SyncedClock } from './index.js';

export interface DynamoDbStoreOptions {
  /** A DynamoDB-compatible server (`http://127.0.0.1:8000`) or another endpoint; default AWS's for the region. */
  endpoint?: string;
  /** The region (default: the SDK's chain; `us-east-1` for an `http:` endpoint). */
  region?: string;
  /** The table (default `idem_records`): 3 to 255 characters of a-z, A-Z, 0-9, _, - and `.`. */
  table?: string;
  /** How long a request may take before it fails as unavailable (default 2 000 ms). */
  timeoutMs?: number;
  /** How often the clock (the `Date` of DynamoDB's responses) is read again: 100 to 3 600 000 ms (default 1 000). */
  clockSyncMs?: number;
  /** The SDK's credentials (default: its chain; dummy ones for an `http:` endpoint without AWS_* variables). */
  credentials?: { accessKeyId: string; secretAccessKey: string; sessionToken?: string };
}

/** An item's attributes as DynamoDB's JSON (`B` values as bytes). */
export type Item = Record<string, Record<string, unknown>>;

/** The store primitives on DynamoDB; a `Guard` over it is an `AsyncGuard`. */
export declare class DynamoDbStore implements AsyncStore {
  /** Creates the table if it is absent, reads the clock; rejects if the endpoint does not answer. */
  static open(options?: DynamoDbStoreOptions): Promise<DynamoDbStore>;
  private constructor();
  readonly async: true;
  /** The table the records are in. */
  readonly table: string;
  /** The store's time authority: AWS's clock from the `Date` header of DynamoDB's responses (whole seconds), kept synced while the store is open. */
  readonly clock: SyncedClock;
  /** How long a request may take (the `timeoutMs` it was opened with). */
  readonly timeoutMs: number;
  get(key: string, nowMs: bigint): Promise<Entry | undefined>;
  insert(key: string, record: StoredRecord, nowMs: bigint): Promise<InsertOutcome>;
  replace(key: string, expectedVersion: bigint, record: StoredRecord, nowMs: bigint): Promise<boolean>;
  /** Removes the item live at `nowMs` (default: now by the store's clock), only at `expectedVersion` when given. */
  delete(key: string, expectedVersion?: bigint, nowMs?: bigint | number): Promise<boolean>;
  /** Deletes at most `limit` items expired at `nowMs`; resolves to how many. */
  purgeExpired(nowMs: bigint | number, limit: number): Promise<number>;
  /** Stops reading the clock and closes the client's connections. */
  close(): Promise<void>;
}

/** DynamoDB's TTL attribute for a record expiring at `expiresAtMs`: seconds, rounded up, plus 60. */
export declare function ttlSeconds(expiresAtMs: bigint): bigint;
/** The record's attributes without `key` and `version`. */
export declare function recordAttributes(record: StoredRecord): Item;
/** The whole item for `record` at `version` under `key`. */
export declare function encodeItem(key: string, version: bigint, record: StoredRecord): Item;
/** The entry an item holds; throws a corrupt `StoreError` naming `key`. */
export declare function decodeItem(key: string, item: Item): Entry;
/** An HTTP `Date` in milliseconds since the epoch. */
export declare function dateMs(date: string): number;
