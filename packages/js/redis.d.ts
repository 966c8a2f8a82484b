// Types of @idem/guard/redis (redis.js): the store primitives on Redis in the
// shared on-store layout (wit/store-layout/README.md), over a connection of
// its own (resp.js): no client package needed.

import type { Entry, StoredRecord } from './index.js';
import { ServerStore } from './server-store.js';

export interface RedisStoreOptions {
  /** `redis://[[user]:password@]host[:port][/db]`, or `rediss://` for TLS (default redis://127.0.0.1:6379). */
  url?: string;
  /** Put before every key (default ''); hosts sharing keys use the same. */
  prefix?: string;
  /** How much longer than a record's life (by the store's clock) Redis keeps it (default 60 000 ms). */
  graceMs?: number;
  /** How long connecting or a command may take before it fails as unavailable (default 2 000 ms). */
  timeoutMs?: number;
  /**
   * `auto` (default): a completion, renewal or checkpoint is `SET … IFEQ` on a server that has it (Valkey 8.1+,
   * asked at open) when the store knows the record's bytes, else the layout's `replace` script; `script`: always the script.
   */
  cas?: 'auto' | 'script';
  /** How often the server's clock (the store's time authority) is read again: 100 to 3 600 000 ms (default 1 000). */
  clockSyncMs?: number;
  /** Options for Node's `tls.connect` with `rediss://`: a `ca` to trust, a client `cert` and `key`, any other it takes. */
  tls?: {
    ca?: string | Uint8Array | Array<string | Uint8Array>;
    cert?: string | Uint8Array | Array<string | Uint8Array>;
    key?: string | Uint8Array | Array<string | Uint8Array>;
    [option: string]: unknown;
  };
}

/**
 * The store primitives on Redis (`ServerStore`); a `Guard` over it is an `AsyncGuard`. Its clock is the
 * server's `TIME`; `close()` fails the commands still unanswered as unavailable.
 */
export declare class RedisStore extends ServerStore {
  /** Connects, loads the layout's scripts and reads the server's clock; rejects if the server does not answer. */
  static open(options?: RedisStoreOptions): Promise<RedisStore>;
  private constructor();
  /** The prefix every key is stored under. */
  readonly prefix: string;
  /** Whether completions and renewals use the server's `SET … IFEQ` rather than the script. */
  readonly nativeCas: boolean;
}

/** A record at `version` as the bytes stored for it. */
export declare function encodeValue(version: bigint, record: StoredRecord): Uint8Array;

/** The entry stored as `value`; throws a `StoreError` (`corrupt`, naming `key`) when it does not decode. */
export declare function decodeValue(key: string, value: Uint8Array): Entry;
