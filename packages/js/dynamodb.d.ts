// Types of @idem/guard/dynamodb (dynamodb.js): the store primitives on
// DynamoDB in the shared on-store layout (wit/store-layout/README.md).
// Needs the optional peer dependency `@aws-sdk/client-dynamodb`.

import type { Entry, StoredRecord } from './index.js';
import { ServerStore } from './server-store.js';

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

/**
 * The store primitives on DynamoDB (`ServerStore`); a `Guard` over it is an `AsyncGuard`. Its clock is AWS's,
 * from the `Date` header of DynamoDB's responses (whole seconds); `close()` closes the client's connections.
 */
export declare class DynamoDbStore extends ServerStore {
  /** Creates the table if it is absent, reads the clock; rejects if the endpoint does not answer. */
  static open(options?: DynamoDbStoreOptions): Promise<DynamoDbStore>;
  private constructor();
  /** The table the records are in. */
  readonly table: string;
  /** Deletes at most `limit` items expired at `nowMs`; resolves to how many. */
  purgeExpired(nowMs: bigint | number, limit: number): Promise<number>;
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
