// The Redis connection RedisStore talks through: one socket (TCP, or TLS for
// `rediss://`), commands written as RESP2 arrays of bulk strings and answered
// in order, replies read by a small parser. A store needs a few commands
// (GET, SET, EVALSHA, SCRIPT LOAD) and nothing of a general client (no
// pub/sub, no cluster, no offline queue, no retries); what a general client
// does around each command cost more than the command itself
// (benchmarks/log.md, "On Redis, from the packages").
//
// Failure: a connection that errs, closes, sends bytes that are not RESP, or
// leaves its oldest command unanswered for `timeoutMs` is dead: every command
// on it fails, none is resent (the store cannot know whether a write was
// applied; the guard fails closed), and the store opens a new one for its
// next command. An error reply (`-ERR ...`) is a `ReplyError` value, not a
// failure of the connection: the stream stays in step, and the caller
// decides (RedisStore retires the connection after most: `retire`).

import net from 'node:net';
import tls from 'node:tls';

/** An error reply from the server: `message` is its text, as `ERR unknown command`. */
export class ReplyError extends Error {
  constructor(message) {
    super(message);
    this.name = 'ReplyError';
  }
}

/** The connection failed, closed or timed out; `message` says which. */
export class ConnectionError extends Error {
  constructor(message) {
    super(message);
    this.name = 'ConnectionError';
  }
}

/**
 * `redis://[[username]:password@]host[:port][/db]` (or `rediss://` for TLS)
 * as `{ host, port, username, password, db, tls }`; a RangeError naming what
 * is wrong otherwise.
 */
export function parseUrl(url) {
  let u;
  try {
    u = new URL(url);
  } catch {
    throw new RangeError(`${JSON.stringify(url)} is not a URL (expected redis://[[user]:password@]host[:port][/db])`);
  }
  if (u.protocol !== 'redis:' && u.protocol !== 'rediss:') {
    throw new RangeError(`the URL's scheme ${JSON.stringify(u.protocol.slice(0, -1))} is not redis or rediss`);
  }
  if (!u.hostname) throw new RangeError('the URL names no host');
  const path = u.pathname.replace(/^\//, '');
  if (path !== '' && !/^[0-9]{1,5}$/.test(path)) throw new RangeError(`the URL's database ${JSON.stringify(path)} is not a number`);
  if (u.search || u.hash) throw new RangeError('the URL takes no query or fragment');
  return {
    host: u.hostname.replace(/^\[(.*)\]$/, '$1'), // [::1] -> ::1
    port: u.port ? Number(u.port) : 6379,
    username: decodeURIComponent(u.username),
    password: decodeURIComponent(u.password),
    db: path === '' ? 0 : Number(path),
    tls: u.protocol === 'rediss:',
  };
}

/** Writes the decimal digits of `n` (a non-negative integer) at `at`; returns the new offset. */
function digits(out, at, n) {
  if (n < 10) {
    out[at] = 48 + n;
    return at + 1;
  }
  return at + out.latin1Write(String(n), at);
}

/** Writes a RESP header: `type` (`*` or `$`), the count `n`, CRLF. */
function head(out, at, type, n) {
  out[at] = type;
  at = digits(out, at + 1, n);
  out[at] = 13;
  out[at + 1] = 10;
  return at + 2;
}

/** Writes `text` as a bulk string's header and its UTF-8; short ASCII (numbers, names) byte by byte, cheaper than a call into C++. */
function string(out, at, text) {
  const n = text.length;
  if (n <= 64) {
    let ascii = true;
    for (let i = 0; i < n; i++) if (text.charCodeAt(i) > 127) ascii = false;
    if (ascii) {
      at = head(out, at, 36, n);
      for (let i = 0; i < n; i++) out[at + i] = text.charCodeAt(i);
      return at + n;
    }
  }
  const bytes = Buffer.byteLength(text, 'utf8');
  at = head(out, at, 36, bytes);
  return at + out.utf8Write(text, at, bytes);
}

/** The command `args` (strings, in UTF-8, or bytes) as one RESP array of bulk strings, in one buffer. */
export function pack(args) {
  let size = 16; // "*{count}\r\n"
  for (let i = 0; i < args.length; i++) {
    const arg = args[i];
    // "${n}\r\n" ... "\r\n"; a string takes at most 3 bytes of UTF-8 per UTF-16 unit
    size += (typeof arg === 'string' ? arg.length * 3 : arg.length) + 16;
  }
  const out = Buffer.allocUnsafe(size);
  let at = head(out, 0, 42, args.length);
  for (let i = 0; i < args.length; i++) {
    const arg = args[i];
    if (typeof arg === 'string') {
      at = string(out, at, arg);
    } else {
      at = head(out, at, 36, arg.length);
      out.set(arg, at);
      at += arg.length;
    }
    out[at] = 13;
    out[at + 1] = 10;
    at += 2;
  }
  return out.subarray(0, at);
}

/** The bytes one read of a plain TCP connection takes at most. */
const READ_BUFFER = 64 * 1024;

/** The longest bulk string a reply may announce: Redis's limit on a string (512 MiB). */
const MAX_BULK = 512 * 1024 * 1024;
/** The most elements a reply's array may announce: far past the store's replies (at most 2), so a stream out of step fails at once. */
const MAX_ARRAY = 1024;

/** Returned by `parse` when the buffer ends inside a reply. */
const INCOMPLETE = Symbol('incomplete');

/** The end of the line starting at `at` (the index of its `\r`), or -1. */
function lineEnd(buf, at) {
  const end = buf.indexOf(13, at);
  return end < 0 || end + 1 >= buf.length ? -1 : end;
}

/** A reply's integer (length or `:` value); throws when it is not one. */
function integer(buf, at, end) {
  const text = buf.latin1Slice(at, end);
  if (!/^-?[0-9]{1,20}$/.test(text)) throw new ConnectionError(`the server sent ${JSON.stringify(text)} where RESP has an integer`);
  const n = Number(text);
  return Number.isSafeInteger(n) ? n : BigInt(text);
}

/**
 * One reply from `buf` at `at`: `[value, next]`, or INCOMPLETE. Values: a
 * simple string is a string; an error a ReplyError; an integer a number (a
 * BigInt past 2^53); a bulk string a Buffer (null when absent); an array an
 * Array (null when absent).
 */
function parse(buf, at) {
  if (at >= buf.length) return INCOMPLETE;
  const end = lineEnd(buf, at);
  if (end < 0) return INCOMPLETE;
  if (buf[end + 1] !== 10) throw new ConnectionError('the server sent a line not ended by CRLF');
  const type = buf[at];
  switch (type) {
    case 43: // '+'
      return [buf.latin1Slice(at + 1, end), end + 2];
    case 45: // '-'
      return [new ReplyError(buf.toString('utf8', at + 1, end)), end + 2];
    case 58: // ':'
      return [integer(buf, at + 1, end), end + 2];
    case 36: {
      // '$'
      const n = integer(buf, at + 1, end);
      if (n === -1) return [null, end + 2];
      if (typeof n !== 'number' || n < 0 || n > MAX_BULK) {
        throw new ConnectionError(`the server sent a bulk string of length ${n}, outside 0 to ${MAX_BULK} (Redis's 512 MiB)`);
      }
      const start = end + 2;
      if (start + n + 2 > buf.length) return INCOMPLETE;
      return [Buffer.from(buf.subarray(start, start + n)), start + n + 2]; // a copy: the read buffer is reused
    }
    case 42: {
      // '*'
      const n = integer(buf, at + 1, end);
      if (n === -1) return [null, end + 2];
      if (typeof n !== 'number' || n < 0 || n > MAX_ARRAY) {
        throw new ConnectionError(`the server sent an array of length ${n}, outside 0 to ${MAX_ARRAY} (the store's commands answer with at most 2)`);
      }
      const items = new Array(n);
      let next = end + 2;
      for (let i = 0; i < n; i++) {
        const item = parse(buf, next);
        if (item === INCOMPLETE) return INCOMPLETE;
        [items[i], next] = item;
      }
      return [items, next];
    }
    default:
      throw new ConnectionError(`the server sent a reply of type ${JSON.stringify(String.fromCharCode(type))}, not RESP2`);
  }
}

/**
 * One socket to a Redis server. `send` writes a packed command and resolves
 * with its reply (an error reply resolves as a ReplyError value: the caller
 * decides); a dead connection rejects with `failure(why)` (`open`).
 */
export class Connection {
  #socket;
  #timeoutMs;
  /** Commands sent and not yet answered, oldest first: `{ resolve, reject, sentAt }`. */
  #pending = [];
  /** What the replies so far left unread. */
  #buffer = null;
  #timer;
  #failure;
  /** Why the connection is dead, or null while it lives. */
  dead = null;
  /** Why the connection takes no more commands (`retire`), or null. */
  retired = null;

  /**
   * Connects to `parseUrl`'s `{ host, port, tls }`, authenticates and selects
   * the database; fails with a ConnectionError (or the server's ReplyError)
   * when that does not complete within `timeoutMs`. `tlsOptions` go to
   * `tls.connect` (a CA, a client certificate). Once open, a command on a
   * dead connection rejects with `failure(why)` (default a ConnectionError):
   * a store makes it the error its callers expect, with no wrapper between.
   */
  static async open(target, { timeoutMs, tlsOptions = {}, failure = (why) => new ConnectionError(why) }) {
    // Plain TCP reads into one buffer of the connection's own (`onread`),
    // past the stream machinery of 'data' events; TLS has no such mode.
    let reader = null;
    const onread = { buffer: Buffer.allocUnsafe(READ_BUFFER), callback: (n, buf) => reader(buf.subarray(0, n)) };
    const socket = await new Promise((resolve, reject) => {
      const s = target.tls
        ? tls.connect({ host: target.host, port: target.port, servername: net.isIP(target.host) ? undefined : target.host, ...tlsOptions })
        : net.connect({ host: target.host, port: target.port, onread });
      const timer = setTimeout(() => {
        s.destroy();
        reject(new ConnectionError(`cannot connect to ${target.host}:${target.port} within ${timeoutMs} ms`));
      }, timeoutMs);
      s.once(target.tls ? 'secureConnect' : 'connect', () => {
        clearTimeout(timer);
        s.removeAllListeners('error');
        resolve(s);
      });
      s.once('error', (e) => {
        clearTimeout(timer);
        reject(new ConnectionError(e.message));
      });
    });
    socket.setNoDelay(true);
    const conn = new Connection(socket, timeoutMs, failure);
    reader = (chunk) => conn.#read(chunk);
    if (target.tls) socket.on('data', reader);
    try {
      if (target.password || target.username) {
        const auth = target.username ? ['AUTH', target.username, target.password] : ['AUTH', target.password];
        check(await conn.send(pack(auth)));
      }
      if (target.db) check(await conn.send(pack(['SELECT', String(target.db)])));
    } catch (e) {
      conn.close();
      throw e;
    }
    return conn;
  }

  constructor(socket, timeoutMs, failure) {
    this.#socket = socket;
    this.#timeoutMs = timeoutMs;
    this.#failure = failure;
    socket.on('error', (e) => this.#fail(e.message));
    socket.on('end', () => this.#fail('the server closed the connection'));
    socket.on('close', () => this.#fail('the server closed the connection'));
    // One timer for the whole connection, checking the oldest command: no timer per command.
    this.#timer = setTimeout(() => this.#check(), timeoutMs);
    this.#timer.unref();
  }

  /** Writes `packed` (from `pack`) and resolves with the reply. */
  send(packed) {
    if (this.dead) return Promise.reject(this.#failure(this.dead));
    return new Promise((resolve, reject) => {
      if (this.#pending.length === 0) this.#timer.refresh();
      this.#pending.push({ resolve, reject, sentAt: performance.now() });
      this.#socket.write(packed);
    });
  }

  /**
   * Takes no more commands (`retired` says why) and ends once those sent
   * have been answered: for a server that answered as one to leave
   * (`READONLY` after a failover, `LOADING`), so the next command connects
   * afresh while the commands in flight still get their replies.
   */
  retire(why) {
    this.retired ??= why;
    if (this.#pending.length === 0) this.close();
  }

  /** Ends the connection; commands still waiting fail. */
  close() {
    this.#fail('the connection was closed');
    this.#socket.end();
  }

  #read(chunk) {
    const buf = this.#buffer === null ? chunk : Buffer.concat([this.#buffer, chunk]);
    let at = 0;
    try {
      for (;;) {
        const reply = parse(buf, at);
        if (reply === INCOMPLETE) break;
        at = reply[1];
        const waiting = this.#pending.shift();
        if (!waiting) throw new ConnectionError('the server sent a reply to no command');
        waiting.resolve(reply[0]);
        if (this.retired !== null && this.#pending.length === 0) this.close();
      }
    } catch (e) {
      this.#fail(e.message);
      return;
    }
    // A copy: the read buffer is reused by the next read.
    this.#buffer = at === buf.length ? null : Buffer.from(buf.subarray(at));
  }

  #check() {
    const oldest = this.#pending[0];
    if (!oldest || this.dead) return;
    const waited = performance.now() - oldest.sentAt;
    if (waited >= this.#timeoutMs) {
      this.#fail(`no answer within ${this.#timeoutMs} ms`);
      return;
    }
    this.#timer = setTimeout(() => this.#check(), this.#timeoutMs - waited);
    this.#timer.unref();
  }

  #fail(why) {
    if (this.dead) return;
    this.dead = why;
    clearTimeout(this.#timer);
    this.#socket.destroy();
    const waiting = this.#pending;
    this.#pending = [];
    for (const w of waiting) w.reject(this.#failure(why));
  }
}

/** A reply, unless it is an error reply: then that error, thrown. */
export function check(reply) {
  if (reply instanceof ReplyError) throw reply;
  return reply;
}
