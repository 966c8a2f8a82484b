// @idem/guard/postgres: the store primitives of wit/store.wit on PostgreSQL,
// in the on-store layout every idem host shares (wit/store-layout/README.md):
// one row per key in a table (default `idem_records`) that `idem serve` and
// the Python package read and write too.
//
//   import { Guard } from '@idem/guard';
//   import { PostgresStore } from '@idem/guard/postgres';
//
//   const store = await PostgresStore.open({ url: 'postgres://postgres@127.0.0.1:5432/test' });
//   const guard = Guard.load({ store });          // asynchronous: begin/complete/... return Promises
//   const outcome = await guard.run('order-1', 'sku=A&qty=1', async () => ({ status: 201, body: 'ok' }));
//   await store.close();
//
// At open the layout's schema.sql runs (table name filled in) as one
// multi-statement query, then the schema version must be 2. Each primitive
// is one of the layout's named statements (statements.sql), prepared on
// each pooled connection at its first use, so one round trip; a claim that
// lost a race settles in a second. The client is node-postgres (`pg`) with
// its Pool.
//
// The guard's clock is the store's (`store.clock`, wit/clock.wit): the
// server's `clock_timestamp()` (the layout's `now` statement), read at open
// and every `clockSyncMs` (1 s) after and carried between reads by this
// process's monotonic clock (clock.js, `SyncedClock`): every host on the
// database judges leases by the same time, whatever its wall clock says. A
// server whose clock cannot be read at open is not opened.

import pg from 'pg';
import { checkedSyncMs, SYNC_EVERY_MS, startSyncing } from './clock.js';
import { StoreError } from './index.js';
import { layoutFile } from './layout.js';
import { checkedTimeoutMs, ServerStore } from './server-store.js';

const NAME = 'postgres';
/** The table layout this package reads and writes, kept in `idem_schema`. */
export const SCHEMA_VERSION = 2;
const I64_MAX = 2n ** 63n - 1n;
const TABLE = /^[a-z_][a-z0-9_]{0,47}$/;

function corrupt(key, reason) {
  return new StoreError('corrupt', `${NAME} store: the record for key ${JSON.stringify(key)} does not decode: ${reason}`);
}

function unavailable(reason) {
  return new StoreError('unavailable', `${NAME} store: ${reason}`);
}

/** A u64 time or version as the BIGINT it is stored as: past 2^63 - 1 it saturates (the year 292 million). */
const int = (v) => (v > I64_MAX ? I64_MAX : v);

/**
 * The record as the statements' parameters after the key (and version and
 * now), in the layout's column order: fingerprint, state, lease, expiry,
 * status, header names, header values, body, holder (the u64's bits as a
 * two's-complement i64), phase, checkpoint data. BIGINTs as bigints.
 */
export function recordParams(record) {
  const r = record.response;
  const c = record.checkpoint;
  return [
    record.fingerprint,
    record.state,
    int(record.leaseUntilMs),
    int(record.expiresAtMs),
    r ? r.status : null,
    r ? r.headers.map(([name]) => name) : null,
    r ? r.headers.map(([, value]) => value) : null,
    r ? r.body : null,
    BigInt.asIntN(64, record.holder ?? 0n),
    c ? c.phase : null,
    c ? c.data : null,
  ];
}

/** A BIGINT as node-postgres returns it (a decimal string), as a u64 that must not be negative. */
function unsigned(key, name, v) {
  const n = BigInt(v);
  if (n < 0n) throw corrupt(key, `the column ${name} is negative (${n})`);
  return n;
}

const bytes = (b) => new Uint8Array(b.buffer, b.byteOffset, b.byteLength);

/**
 * The entry in the layout's twelve columns of `row` (an array, as node-postgres
 * returns it with `rowMode: 'array'`) from column `at`: version, fingerprint,
 * state, lease, expiry, status, header names, header values, body, holder,
 * phase, checkpoint. A corrupt StoreError naming `key` when they do not decode.
 */
export function decodeRow(key, row, at = 0) {
  const [version, fingerprint, state, lease, exp, status, names, values, body, holder, phase, data] = row.slice(at, at + 12);
  if (state !== 'processing' && state !== 'done') throw corrupt(key, `unknown state ${JSON.stringify(state)}`);
  if (typeof fingerprint !== 'string') throw corrupt(key, 'the fingerprint is NULL');
  const record = {
    fingerprint,
    state,
    holder: BigInt.asUintN(64, BigInt(holder)),
    leaseUntilMs: unsigned(key, 'lease_until_ms', lease),
    expiresAtMs: unsigned(key, 'expires_at_ms', exp),
  };
  const set = [status, names, values, body].filter((v) => v !== null).length;
  if (set === 4 && names.length === values.length) {
    if (!(status >= 0 && status <= 0xffff)) throw corrupt(key, `status ${status} is out of range`);
    record.response = { status, headers: names.map((name, i) => [name, bytes(values[i])]), body: bytes(body) };
  } else if (set !== 0) {
    throw corrupt(key, 'the response columns are inconsistent (status, header names/values, body)');
  }
  if (phase !== null && data !== null) record.checkpoint = { phase, data: bytes(data) };
  else if (phase !== null || data !== null) throw corrupt(key, 'the checkpoint columns are inconsistent (phase, checkpoint)');
  return { record, version: unsigned(key, 'version', version) };
}

/** The statement `name` of statements.sql: its text up to the next name, without the final `;`. */
function statement(file, name) {
  const marker = `-- name: ${name}\n`;
  const start = file.indexOf(marker);
  if (start < 0) throw new Error(`statements.sql has no statement ${name}`);
  let text = file.slice(start + marker.length);
  const next = text.indexOf('-- name: ');
  if (next >= 0) text = text.slice(0, next);
  return text.trimEnd().replace(/;+$/, '');
}

/**
 * The store primitives on a PostgreSQL database, asynchronous (`async:
 * true`): a `Guard` over it replays each call from a journal and returns
 * Promises. Its clock is the server's `clock_timestamp()`; its timeout bounds
 * a connection and a statement.
 */
export class PostgresStore extends ServerStore {
  #pool;
  #table;
  #sql;

  /**
   * Creates the table if needed (the layout's schema.sql), checks its schema
   * version, and opens a pool. Fails when the server cannot be reached now;
   * after that, each operation fails as unavailable while it cannot.
   *
   * @param {object} options
   * @param {string} options.url       `postgres://user[:password]@host[:port]/db`
   * @param {string} options.table     the table (default `idem_records`): 1 to 48 of a-z, 0-9 and _, not starting with a digit
   * @param {number} options.poolSize  connections at most (default 10)
   * @param {number} options.timeoutMs how long a connection or a statement may take before it fails as unavailable (default 2 000)
   * @param {number} options.clockSyncMs how often the server's clock is read again (default 1 000; 100 to 3 600 000)
   */
  static async open({ url, table = 'idem_records', poolSize = 10, timeoutMs = 2_000, clockSyncMs = SYNC_EVERY_MS } = {}) {
    if (typeof url !== 'string') throw new TypeError('url must be a postgres:// URL');
    if (typeof table !== 'string' || !TABLE.test(table)) {
      throw new RangeError(`table=${JSON.stringify(table)} must be 1 to 48 characters of a-z, 0-9 and _, not starting with a digit`);
    }
    checkedTimeoutMs(timeoutMs);
    checkedSyncMs(clockSyncMs);
    const pool = new pg.Pool({
      connectionString: url,
      max: poolSize,
      connectionTimeoutMillis: timeoutMs,
      query_timeout: timeoutMs,
      application_name: 'idem',
    });
    // An idle connection the server closed: the pool drops it and opens another; not a crash.
    pool.on('error', () => {});
    try {
      const client = await pool.connect();
      try {
        await client.query(layoutFile('postgres/schema.sql').replaceAll('{t}', table));
        const { rows } = await client.query('SELECT version FROM idem_schema WHERE table_name = $1', [table]);
        const found = rows[0]?.version;
        if (found !== SCHEMA_VERSION) {
          throw new Error(`the table ${JSON.stringify(table)} has schema version ${found}; this package reads version ${SCHEMA_VERSION}`);
        }
      } finally {
        client.release();
      }
      // The time authority: read once now (a guard on a clock never read
      // fails every call closed) and every clockSyncMs after.
      const store = new PostgresStore(pool, table, timeoutMs);
      await startSyncing(store.clock, clockSyncMs, () => store.#serverTime());
      return store;
    } catch (e) {
      await pool.end().catch(() => {});
      throw new Error(`${NAME} store: cannot open ${shown(url)}: ${describe(e)}`);
    }
  }

  constructor(pool, table, timeoutMs) {
    super("the PostgreSQL server's clock (clock_timestamp())", timeoutMs);
    this.#pool = pool;
    this.#table = table;
    const file = layoutFile('postgres/statements.sql');
    this.#sql = Object.fromEntries(
      ['claim', 'settle', 'get', 'replace', 'delete', 'purge', 'now'].map((name) => [
        name,
        // Named: node-postgres prepares it once per connection and then only binds.
        { name: `idem_${table}_${name}`, text: statement(file, name).replaceAll('{t}', table), rowMode: 'array' },
      ]),
    );
  }

  /** The table the records are in. */
  get table() {
    return this.#table;
  }

  /** The server's time in ms since the epoch: the `now` statement. */
  async #serverTime() {
    const { rows } = await this.#query('now', []);
    return BigInt(rows[0][0]);
  }

  /** Stops reading the server's clock and closes every connection of the pool. */
  async close() {
    this.clock.stop();
    await this.#pool.end();
  }

  async #query(name, values) {
    try {
      return await this.#pool.query({ ...this.#sql[name], values });
    } catch (e) {
      throw unavailable(/timeout/i.test(e?.message ?? '') ? `no answer within ${this.timeoutMs} ms (${describe(e)})` : describe(e));
    }
  }

  async get(key, nowMs) {
    const { rows } = await this.#query('get', [key, int(nowMs)]);
    return rows.length ? decodeRow(key, rows[0]) : undefined;
  }

  async insert(key, record, nowMs) {
    const now = int(nowMs);
    const params = [key, now, ...recordParams(record)];
    const { rows } = await this.#query('claim', params);
    const row = rows[0];
    if (!row) throw unavailable('the claim returned no row');
    // The layout's columns (expires_at_ms is the fifth), then the claimed version.
    if (row[12] !== null) return { tag: 'inserted', val: BigInt(row[12]) };
    if (row[4] !== null && BigInt(row[4]) > now) return { tag: 'existing', val: decodeRow(key, row) };
    // A concurrent claimer committed the key after this claim read it: settle, which returns the winner's row.
    const settled = (await this.#query('settle', params)).rows[0];
    if (!settled) throw unavailable('the claim returned no row');
    if (settled[0] === true) return { tag: 'inserted', val: BigInt(settled[1]) };
    return { tag: 'existing', val: decodeRow(key, settled, 1) };
  }

  /** Writes the record at `expectedVersion + 1` if the row live at `nowMs` is at `expectedVersion`: whether it did. */
  async replace(key, expectedVersion, record, nowMs) {
    if (expectedVersion >= I64_MAX) return false; // no stored version is that high: refused, not an error
    const { rowCount } = await this.#query('replace', [key, expectedVersion, int(nowMs), ...recordParams(record)]);
    return rowCount === 1;
  }

  /**
   * Removes the row live at `nowMs` (default: now by the store's clock),
   * only at `expectedVersion` when given: whether it did. An expired row is
   * left alone (false); the purge frees it.
   */
  async delete(key, expectedVersion, nowMs = this.clock.nowMs()) {
    const { rowCount } = await this.#query('delete', [key, expectedVersion === undefined ? null : int(expectedVersion), int(BigInt(nowMs))]);
    return rowCount === 1;
  }

  /**
   * Deletes at most `limit` rows expired at `nowMs` (the layout's `purge`:
   * the oldest expiry first, rows another session holds skipped); returns
   * how many. A `Guard` over this store calls it every `purgeEveryMs`.
   */
  async purgeExpired(nowMs, limit) {
    if (!(Number.isInteger(limit) && limit > 0)) throw new RangeError(`limit ${limit} must be a positive whole number`);
    const { rowCount } = await this.#query('purge', [int(BigInt(nowMs)), limit]);
    return rowCount;
  }
}

/** The server's message with its SQLSTATE when there is one. */
function describe(e) {
  if (e?.code && e?.message) return `${e.code}: ${e.message}`;
  return e?.message || String(e);
}

/** The URL without its password, for messages. */
function shown(url) {
  return url.replace(/\/\/([^@/]*):[^@/]*@/, '//$1:***@');
}
