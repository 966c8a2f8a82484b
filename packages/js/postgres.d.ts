// Types of @idem/guard/postgres (postgres.js): the store primitives on
// PostgreSQL in the shared on-store layout (wit/store-layout/README.md).
// Needs the optional peer dependency `pg`.

import type { Entry, StoredRecord } from './index.js';
import { ServerStore } from './server-store.js';

export interface PostgresStoreOptions {
  /** `postgres://user[:password]@host[:port]/db`. */
  url: string;
  /** The table (default `idem_records`): 1 to 48 characters of a-z, 0-9 and _, not starting with a digit. */
  table?: string;
  /** Connections at most (default 10). */
  poolSize?: number;
  /** How long a connection or a statement may take before it fails as unavailable (default 2 000 ms). */
  timeoutMs?: number;
  /** How often the server's clock (the store's time authority) is read again: 100 to 3 600 000 ms (default 1 000). */
  clockSyncMs?: number;
}

/** The table layout this package reads and writes (2). */
export declare const SCHEMA_VERSION: number;

/**
 * The store primitives on PostgreSQL (`ServerStore`); a `Guard` over it is an `AsyncGuard`. Its clock is the
 * server's `clock_timestamp()`; `close()` closes every connection of the pool.
 */
export declare class PostgresStore extends ServerStore {
  /** Creates the table if needed, checks its schema version, opens the pool, reads the server's clock; rejects if the server does not answer. */
  static open(options: PostgresStoreOptions): Promise<PostgresStore>;
  private constructor();
  /** The table the records are in. */
  readonly table: string;
  /** Deletes at most `limit` rows expired at `nowMs`, oldest expiry first; resolves to how many. */
  purgeExpired(nowMs: bigint | number, limit: number): Promise<number>;
}

/** The record as the statements' parameters after the key, in the layout's column order. */
export declare function recordParams(record: StoredRecord): unknown[];

/** The entry in the layout's twelve columns of an array row from column `at`; throws a corrupt `StoreError` naming `key`. */
export declare function decodeRow(key: string, row: unknown[], at?: number): Entry;
