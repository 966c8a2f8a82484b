// @idem/guard/redis: the store primitives of wit/store.wit on Redis (or
// Valkey), in the on-store layout every idem host shares
// (wit/store-layout/README.md): a key claimed here is in flight for
// `idem serve` and the Python package pointed at the same server and prefix,
// and replayed by them byte for byte.
//
//   import { Guard } from '@idem/guard';
//   import { RedisStore } from '@idem/guard/redis';
//
//   const store = await RedisStore.open({ url: 'redis://127.0.0.1:6379', prefix: 'shop:' });
//   const guard = Guard.load({ store });          // asynchronous: begin/complete/... return Promises
//   const outcome = await guard.run('order-1', 'sku=A&qty=1', async () => ({ status: 201, body: 'ok' }));
//   await store.close();
//
// Each record is one string at `{prefix}{key}`: the header
// "{version} {expires_at_ms}\n" then the record, big-endian. A claim is
// `SET NX GET PX`; a claim of a record expired by the guard's clock that
// Redis still holds (its grace period), a replace and a delete are the
// layout's Lua scripts (EVALSHA, loaded again on NOSCRIPT). Expiry compares
// the guard's `nowMs`; PX is the record's remaining life by the guard's
// clock plus `graceMs`.
//
// The guard's clock is the store's (`store.clock`, wit/clock.wit): the
// server's own, `TIME` through the layout's time.lua on the key
// "{prefix}\x01clock" (so a Redis Cluster's hosts all ask one node), read at
// open and every `clockSyncMs` (1 s) after and carried between reads by
// this process's monotonic clock (clock.js, `SyncedClock`): every host on
// the server judges leases by the same time, whatever its wall clock says.
// A server whose clock cannot be read at open is not opened.
//
// Native compare-and-set, as the Rust store: on a server that has `SET key
// value IFEQ old` (Valkey 8.1 and later, asked at open with a probe that
// writes nothing), a completion, renewal or checkpoint is that one command
// instead of the script whenever the store holds the bytes of the record at
// the expected version — it keeps those of every unfinished record it last
// wrote or read (at most SEEN_MAX keys, then it forgets them all), so the
// usual completion after this process's own claim always does. Bytes that
// differ by anything mean another writer came between: refused, as the
// script would (stricter only for a key Redis dropped and another claim wrote
// again at the same version). Otherwise, or with `cas: 'script'`, the script.
//
// The connection is the store's own (resp.js): one socket, the four
// commands written as RESP and their replies read back as bytes, with no
// general client around them (what one does around each command cost more
// than the command). Connecting and each command are bounded by
// `timeoutMs`; a connection that fails, closes or times out fails every
// command waiting on it as unavailable — none is resent: a write may have
// been applied, and the guard fails closed — and the next command opens a new
// one. So a store needs no dependency.

import { createHash } from 'node:crypto';
import { checkedSyncMs, redisTimeMs, SYNC_EVERY_MS, startSyncing } from './clock.js';
import { StoreError } from './index.js';
import { layoutFile } from './layout.js';
import { Connection, check, pack, parseUrl, ReplyError } from './resp.js';
import { checkedTimeoutMs, ServerStore } from './server-store.js';

const NAME = 'redis';
/** How many records' bytes a store keeps for `SET … IFEQ` before it forgets them all (as the Rust store). */
const SEEN_MAX = 65_536;
const MAX_U64 = 2n ** 64n - 1n;
/** The header "{version} {expires_at_ms}\n" fits in this many bytes (two u64s); the scripts read bytes 0..=41. */
const HEADER_MAX = 42;

function corrupt(key, reason) {
  return new StoreError('corrupt', `${NAME} store: the record for key ${JSON.stringify(key)} does not decode: ${reason}`);
}

function unavailable(reason) {
  return new StoreError('unavailable', `${NAME} store: ${reason}`);
}

// --- the value: wit/store-layout/README.md, "Value" -------------------------

/** A record at `version` as the bytes stored for it (a Buffer). */
export function encodeValue(version, record) {
  const header = `${version} ${record.expiresAtMs}\n`;
  const fingerprint = Buffer.from(record.fingerprint, 'utf8');
  const response = record.response;
  const headers = response ? response.headers.map(([name, value]) => [Buffer.from(name, 'utf8'), value]) : [];
  const checkpoint = record.checkpoint;
  const phase = checkpoint ? Buffer.from(checkpoint.phase, 'utf8') : null;
  let size = header.length + 8 + 1 + 4 + fingerprint.length + 1 + 8 + 1;
  if (response) {
    size += 2 + 4 + 4 + response.body.length;
    for (const [name, value] of headers) size += 8 + name.length + value.length;
  }
  if (checkpoint) size += 8 + phase.length + checkpoint.data.length;
  const out = Buffer.allocUnsafe(size);
  let at = out.write(header, 0, 'latin1');
  const bytes = (b) => {
    out.writeUInt32BE(b.length, at);
    out.set(b, at + 4);
    at += 4 + b.length;
  };
  at = out.writeBigUInt64BE(record.leaseUntilMs, at);
  at = out.writeUInt8(record.state === 'done' ? 1 : 0, at);
  bytes(fingerprint);
  if (response) {
    at = out.writeUInt8(1, at);
    at = out.writeUInt16BE(response.status, at);
    at = out.writeUInt32BE(headers.length, at);
    for (const [name, value] of headers) {
      bytes(name);
      bytes(value);
    }
    bytes(response.body);
  } else {
    at = out.writeUInt8(0, at);
  }
  at = out.writeBigUInt64BE(record.holder ?? 0n, at);
  if (checkpoint) {
    at = out.writeUInt8(1, at);
    bytes(phase);
    bytes(checkpoint.data);
  } else {
    at = out.writeUInt8(0, at);
  }
  return out;
}

const DIGITS = /^[0-9]+$/;

/** The header's length, version and expiry, or null when it does not decode. */
function header(value) {
  const end = value.subarray(0, HEADER_MAX).indexOf(0x0a);
  if (end < 0) return null;
  const text = value.latin1Slice(0, end);
  const space = text.indexOf(' ');
  if (space < 0) return null;
  const version = text.slice(0, space);
  const expires = text.slice(space + 1);
  if (!DIGITS.test(version) || !DIGITS.test(expires)) return null;
  const v = BigInt(version);
  const e = BigInt(expires);
  if (v > MAX_U64 || e > MAX_U64) return null;
  return { start: end + 1, version: v, expiresAtMs: e };
}

const utf8 = new TextDecoder('utf-8', { fatal: true });

/** Reads the layout's fields in order; each failure names what it was reading. */
class Reader {
  constructor(buf, at) {
    this.buf = buf;
    this.at = at;
  }
  #need(n, what) {
    if (this.at + n > this.buf.length) throw new Error(`ends inside ${what}`);
    const at = this.at;
    this.at += n;
    return at;
  }
  empty() {
    return this.at === this.buf.length;
  }
  u8(what) {
    return this.buf.readUInt8(this.#need(1, what));
  }
  u16(what) {
    return this.buf.readUInt16BE(this.#need(2, what));
  }
  u32(what) {
    return this.buf.readUInt32BE(this.#need(4, what));
  }
  u64(what) {
    return this.buf.readBigUInt64BE(this.#need(8, what));
  }
  bytes(what) {
    const n = this.u32(`the length of ${what}`);
    const at = this.#need(n, what);
    return new Uint8Array(this.buf.subarray(at, at + n)); // a copy: the reply buffer is not kept
  }
  text(what) {
    const n = this.u32(`the length of ${what}`);
    const at = this.#need(n, what);
    const buf = this.buf;
    let all = 0;
    for (let i = at; i < at + n; i++) all |= buf[i];
    if (all < 0x80) return buf.latin1Slice(at, at + n); // ASCII (the usual fingerprint and header names): latin-1 and UTF-8 agree
    try {
      return utf8.decode(buf.subarray(at, at + n));
    } catch {
      throw new Error(`has ${what} that is not UTF-8`);
    }
  }
}

/** The entry `{ record, version }` stored as `value`; a corrupt StoreError naming `key` when it does not decode. */
export function decodeValue(key, value) {
  const head = header(value);
  if (!head) throw corrupt(key, 'the stored record has no "{version} {expires_at_ms}" header');
  const r = new Reader(value, head.start);
  try {
    const leaseUntilMs = r.u64('the lease');
    const stateByte = r.u8('the state');
    if (stateByte > 1) throw new Error(`has an unknown state ${stateByte}`);
    const fingerprint = r.text('the fingerprint');
    let response;
    const flag = r.u8('the response flag');
    if (flag === 1) {
      const status = r.u16('the status');
      const count = r.u32('the header count');
      const headers = [];
      for (let i = 0; i < count; i++) headers.push([r.text('a header name'), r.bytes('a header value')]);
      response = { status, headers, body: r.bytes('the body') };
    } else if (flag !== 0) {
      throw new Error(`has an unknown response flag ${flag}`);
    }
    // A 0.1 host's value ends here: holder 0, no checkpoint.
    let holder = 0n;
    let checkpoint;
    if (!r.empty()) {
      holder = r.u64('the holder');
      const cflag = r.u8('the checkpoint flag');
      if (cflag === 1) checkpoint = { phase: r.text("the checkpoint's phase"), data: r.bytes("the checkpoint's data") };
      else if (cflag !== 0) throw new Error(`has an unknown checkpoint flag ${cflag}`);
    }
    if (!r.empty()) throw new Error(`has ${value.length - r.at} bytes after its end`);
    const record = { fingerprint, state: stateByte === 1 ? 'done' : 'processing', holder, leaseUntilMs, expiresAtMs: head.expiresAtMs };
    if (response) record.response = response;
    if (checkpoint) record.checkpoint = checkpoint;
    return { record, version: head.version };
  } catch (e) {
    if (e instanceof StoreError) throw e;
    throw corrupt(key, `the stored record ${e.message}`);
  }
}

// --- the store ---------------------------------------------------------------

/** A Lua script of the layout, run by its SHA1 and loaded again when the server lost it. */
class Script {
  constructor(file) {
    this.text = layoutFile(`redis/${file}`);
    this.sha = createHash('sha1').update(this.text).digest('hex');
  }
}

const SCRIPTS = {};
const script = (name) => (SCRIPTS[name] ??= new Script(`${name}.lua`));
const SCRIPT_NAMES = ['claim_expired', 'replace', 'delete_at', 'time'];
/** The key time.lua runs on, after the prefix: byte 0x01 then `clock` (no idem key has a control character). */
const CLOCK_KEY = '\u0001clock';

/**
 * The store primitives on a Redis server, asynchronous (`async: true`): a
 * `Guard` over it replays each call from a journal and returns Promises. Its
 * clock is the server's `TIME`; its timeout bounds connecting and a command.
 */
export class RedisStore extends ServerStore {
  #target;
  #prefix;
  #graceMs;
  #tlsOptions;
  /** The live connection, or the promise of one being opened. */
  #conn = null;
  #opening = null;
  /**
   * With the server's `SET … IFEQ` (Valkey 8.1+): the bytes of each
   * unfinished record this store last wrote or read, `full key → { version,
   * value }`, so a completion or renewal can be that one native command;
   * null when the script does it.
   */
  #seen = null;

  /**
   * Connects (failing if the server does not answer within the timeout) and
   * loads the layout's scripts.
   *
   * @param {object} options
   * @param {string} options.url       `redis://[[user]:password@]host[:port][/db]`, or `rediss://` for TLS (default redis://127.0.0.1:6379)
   * @param {string} options.prefix    put before every key (default ''); hosts sharing keys use the same
   * @param {number} options.graceMs   how much longer than a record's life Redis keeps it (default 60 000)
   * @param {number} options.timeoutMs how long connecting or a command may take before it fails as unavailable (default 2 000)
   * @param {object} options.tls       options for `tls.connect` with `rediss://` (a `ca`, a client `cert` and `key`)
   * @param {string} options.cas       `auto` (default): a completion is `SET … IFEQ` where the server has it
   *   (Valkey 8.1+, asked at open) and the store knows the record's bytes, else the `replace` script;
   *   `script`: always the script
   * @param {number} options.clockSyncMs how often the server's clock is read again (default 1 000; 100 to 3 600 000)
   */
  static async open({
    url = 'redis://127.0.0.1:6379',
    prefix = '',
    graceMs = 60_000,
    timeoutMs = 2_000,
    tls = {},
    cas = 'auto',
    clockSyncMs = SYNC_EVERY_MS,
  } = {}) {
    if (typeof prefix !== 'string') throw new TypeError('prefix must be a string');
    checkedSyncMs(clockSyncMs);
    if (cas !== 'auto' && cas !== 'script') throw new RangeError(`cas ${JSON.stringify(cas)} is not one of auto, script`);
    if (!(Number.isInteger(graceMs) && graceMs >= 0)) throw new RangeError(`graceMs ${graceMs} must be a whole number of milliseconds`);
    checkedTimeoutMs(timeoutMs);
    let target;
    try {
      target = parseUrl(url);
    } catch (e) {
      throw new RangeError(`${NAME} store: cannot open ${shown(url)}: ${e.message}`);
    }
    const store = new RedisStore(target, prefix, graceMs, timeoutMs, tls);
    try {
      const conn = await store.#connection();
      for (const name of SCRIPT_NAMES) check(await conn.send(pack(['SCRIPT', 'LOAD', script(name).text])));
      if (cas === 'auto' && (await hasIfeq(conn, prefix))) store.#seen = new Map();
      // The time authority: read once now (a guard on a clock never read
      // fails every call closed) and every clockSyncMs after.
      await startSyncing(store.clock, clockSyncMs, () => store.#serverTime());
    } catch (e) {
      store.close();
      throw new Error(`${NAME} store: cannot open ${shown(url)}: ${e?.message ?? e}`);
    }
    return store;
  }

  constructor(target, prefix, graceMs, timeoutMs, tlsOptions) {
    super("the Redis server's clock (TIME)", timeoutMs);
    this.#target = target;
    this.#prefix = prefix;
    this.#graceMs = BigInt(graceMs);
    this.#tlsOptions = tlsOptions;
  }

  /** The prefix every key is stored under. */
  get prefix() {
    return this.#prefix;
  }

  /** The server's time in ms since the epoch: time.lua on "{prefix}\x01clock". */
  async #serverTime() {
    return redisTimeMs(await this.#eval(CLOCK_KEY, 'time', []));
  }

  /** Whether completions and renewals use the server's `SET … IFEQ` (when the record's bytes are known) rather than the script. */
  get nativeCas() {
    return this.#seen !== null;
  }

  /** Notes the bytes of the record at `version` (an unfinished one: a done record is not written again). */
  #remember(full, version, state, value) {
    const seen = this.#seen;
    if (seen === null) return;
    if (state === 'done') {
      seen.delete(full);
      return;
    }
    if (seen.size >= SEEN_MAX && !seen.has(full)) seen.clear();
    seen.set(full, { version, value });
  }

  /** The bytes of the record at `version`, when known; taken out, so a concurrent replace of the key runs the script. */
  #recall(full, version) {
    const seen = this.#seen;
    const known = seen?.get(full);
    if (known === undefined || known.version !== version) return undefined;
    seen.delete(full);
    return known.value;
  }

  /** Closes the connection (commands still unanswered fail as unavailable) and stops reading the server's clock. */
  async close() {
    this.clock.stop();
    this.#conn?.close();
    this.#conn = null;
  }

  /** The live connection, or a new one (concurrent callers share one attempt). */
  #connection() {
    if (usable(this.#conn)) return this.#conn;
    const options = { timeoutMs: this.timeoutMs, tlsOptions: this.#tlsOptions, failure: unavailable };
    this.#opening ??= Connection.open(this.#target, options).then(
      (conn) => {
        this.#opening = null;
        this.#conn = conn;
        return conn;
      },
      (e) => {
        this.#opening = null;
        throw e;
      },
    );
    return this.#opening;
  }

  #full(key) {
    return this.#prefix + key;
  }

  /** PX: the record's remaining life by the guard's clock, plus the grace; at least 1. */
  #ttl(record, nowMs) {
    const rest = record.expiresAtMs > nowMs ? record.expiresAtMs - nowMs : 0n;
    const ttl = rest + this.#graceMs;
    return String(ttl < 1n ? 1n : ttl);
  }

  /**
   * One command's reply; an error reply is returned as a ReplyError value. A
   * server that cannot be reached or does not answer in time is unavailable
   * (the connection rejects with that StoreError itself: no wrapper, no
   * extra turn of the microtask queue per command).
   */
  #send(args) {
    const conn = this.#conn;
    if (usable(conn)) return conn.send(pack(args));
    return this.#connection().then(
      (opened) => opened.send(pack(args)),
      (e) => {
        throw e instanceof StoreError ? e : unavailable(e?.message ?? String(e));
      },
    );
  }

  /**
   * A reply that is not an error reply. WRONGTYPE is a corrupt key; any
   * other error reply is unavailable, and retires the connection: a server
   * that answers READONLY (a replica after a failover) or LOADING is one to
   * leave, so the next command connects afresh, as the Python store does.
   */
  #ok(key, reply) {
    if (!(reply instanceof ReplyError)) return reply;
    if (reply.message.startsWith('WRONGTYPE')) throw corrupt(key, 'the key holds a Redis value that is not a string: not an idem record');
    this.#conn?.retire(reply.message);
    throw unavailable(reply.message);
  }

  /** EVALSHA of a layout script on one key; SCRIPT LOAD and again when the server has lost it. */
  async #eval(key, name, args) {
    const s = script(name);
    const command = ['EVALSHA', s.sha, '1', this.#full(key), ...args];
    let reply = await this.#send(command);
    if (reply instanceof ReplyError && reply.message.startsWith('NOSCRIPT')) {
      this.#ok(key, await this.#send(['SCRIPT', 'LOAD', s.text]));
      reply = await this.#send(command);
    }
    return this.#ok(key, reply);
  }

  async get(key, nowMs) {
    const full = this.#full(key);
    const value = this.#ok(key, await this.#send(['GET', full]));
    if (value === null) return undefined;
    const entry = decodeValue(key, value);
    if (nowMs >= entry.record.expiresAtMs) return undefined;
    this.#remember(full, entry.version, entry.record.state, value);
    return entry;
  }

  async insert(key, record, nowMs) {
    const full = this.#full(key);
    const ttl = this.#ttl(record, nowMs);
    const value = encodeValue(1n, record);
    const held = this.#ok(key, await this.#send(['SET', full, value, 'NX', 'GET', 'PX', ttl]));
    if (held === null) {
      this.#remember(full, 1n, record.state, value);
      return { tag: 'inserted', val: 1n };
    }
    const entry = decodeValue(key, held);
    if (nowMs < entry.record.expiresAtMs) return this.#existing(full, entry, held);
    // Expired by the guard's clock, still held by Redis (the grace period).
    const rest = value.subarray(value.indexOf(0x0a) + 1);
    const reply = await this.#eval(key, 'claim_expired', [String(nowMs), ttl, String(record.expiresAtMs), rest]);
    if (Array.isArray(reply)) {
      if (reply[0] === 0 && reply.length === 2) {
        const version = BigInt(reply[1]);
        if (this.#seen !== null) this.#remember(full, version, record.state, encodeValue(version, record));
        return { tag: 'inserted', val: version };
      }
      if (reply[0] === 1 && reply.length === 2 && Buffer.isBuffer(reply[1])) return this.#existing(full, decodeValue(key, reply[1]), reply[1]);
      if (reply[0] === 2) throw corrupt(key, 'the stored record has no "{version} {expires_at_ms}" header');
    }
    throw unavailable('unexpected reply from claim_expired');
  }

  /** `existing` with the live `entry` held as `value`, its bytes noted. */
  #existing(full, entry, value) {
    this.#remember(full, entry.version, entry.record.state, value);
    return { tag: 'existing', val: entry };
  }

  /** Writes the record at `expectedVersion + 1` if the record live at `nowMs` is at `expectedVersion`: whether it did. */
  async replace(key, expectedVersion, record, nowMs) {
    if (expectedVersion >= MAX_U64) return false; // expected + 1 overflows: refused, not an error
    const full = this.#full(key);
    const version = expectedVersion + 1n;
    const value = encodeValue(version, record);
    const ttl = this.#ttl(record, nowMs);
    const old = this.#recall(full, expectedVersion);
    if (old !== undefined) {
      // The exact bytes at that version: the server compares them whole, and the expiry is theirs.
      const head = header(old);
      if (head === null || head.expiresAtMs <= nowMs) return false;
      const written = this.#ok(key, await this.#send(['SET', full, value, 'IFEQ', old, 'PX', ttl]));
      if (written === null) return false;
      this.#remember(full, version, record.state, value);
      return true;
    }
    const reply = await this.#eval(key, 'replace', [String(expectedVersion), String(nowMs), ttl, value]);
    if (reply === 1) {
      this.#remember(full, version, record.state, value);
      return true;
    }
    if (reply === 0) return false;
    if (reply === -1) throw corrupt(key, 'the stored record has no "{version} {expires_at_ms}" header');
    throw unavailable('unexpected reply from replace');
  }

  /**
   * Removes the record live at `nowMs` (default: now by the store's clock),
   * only at `expectedVersion` when given: whether it did. An expired record
   * is left alone (false), and so is another version; a value whose header
   * does not decode is removed only without a version (the layout's
   * delete_at.lua).
   */
  async delete(key, expectedVersion, nowMs = this.clock.nowMs()) {
    this.#seen?.delete(this.#full(key));
    const removed = await this.#eval(key, 'delete_at', [expectedVersion === undefined ? '' : String(expectedVersion), String(nowMs)]);
    return removed === 1;
  }
}

/**
 * Whether the server has `SET … IFEQ` (Valkey 8.1 and later; Redis 7 answers
 * a syntax error). The probe key holds no record (a control character no
 * idem key has) and IFEQ never creates a key, so the probe writes nothing.
 */
async function hasIfeq(conn, prefix) {
  const reply = await conn.send(pack(['SET', `${prefix}\u0001ifeq-probe`, 'probe', 'IFEQ', 'probe']));
  if (!(reply instanceof ReplyError)) return true;
  if (reply.message.startsWith('ERR')) return false;
  throw reply;
}

/** Whether `conn` takes commands: open, and neither dead nor retired. */
function usable(conn) {
  return conn !== null && conn.dead === null && conn.retired === null;
}

/** The URL without its password, for messages. */
function shown(url) {
  return url.replace(/\/\/([^@/]*):[^@/]*@/, '//$1:***@');
}
