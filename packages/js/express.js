// Express (or any connect-style) middleware with the HTTP semantics of the
// `idem serve` gateway (draft-ietf-httpapi-idempotency-key-header): the
// route runs once per key, its response is stored and replayed byte for
// byte with `Idempotent-Replayed: true`, a stored response (the first and
// every replay) says until when with `Idempotency-Expires`, a repeat in flight is 409, another
// request under a used key is 422, a bad or (when required) missing key is
// 400, a store that is down is 503 and the route never runs, and a 5xx or a
// thrown error releases the key for a retry. Errors are
// application/problem+json with the gateway's types and titles.
//
//   import express from 'express';
//   import { Guard } from '@idem/guard';
//   import { idempotency } from '@idem/guard/express';
//
//   const app = express();
//   app.use(idempotency({ guard: Guard.load(), requireKey: true })); // reads and parses the body
//   app.post('/orders', (req, res) => res.status(201).json(charge(req.body)));
//
// It fingerprints the raw body, so it reads it itself (req.rawBody; req.body
// is parsed JSON for JSON content types, else the Buffer), or takes the
// bytes a body parser mounted before it kept: express.json({ verify: keepRawBody }).
//
// It only uses Node's req/res, so it never imports express.
//
// What it stores: what the request's handler answered. In an Express app a
// client error (4xx) written before the request reached a route (Express
// sets `req.route` as it dispatches to one) — a 404 for no route, or the
// refusal of an app-wide middleware mounted after this one: authentication,
// a rate limiter, validation — is passed through unstored and the key
// released, so the corrected retry under the same key runs (Stripe saves no
// result for a request that failed before it ran). A handler mounted with
// `app.use` (a GraphQL server, a proxy) is outside any route too: its 2xx and
// 3xx are stored as usual. Validation inside a route
// (`app.post('/orders', validate, handler)`) runs after `req.route` is set:
// mount the middleware after it in that route to keep its answers unstored
// (`app.post('/orders', express.json({ verify: keepRawBody }), validate,
// idempotency({ guard }), handler)`). `storeBeforeRoute: true` stores every
// response, as before. On plain node:http (no `req.app`) whatever answers
// after the middleware is the handler.
//
// What it tells clients: a 503 says that nothing ran (or that the outcome is
// not known yet) and when to retry, never what the store is or how it failed;
// the guard's logger (`Guard.load({ logger })`) gets that.

import cluster from 'node:cluster';
import { createHash } from 'node:crypto';
import { monotonicMs } from './clock.js';
import { fingerprint, GuardError, NotRecordedError, processLocal } from './index.js';

/** The longest key a client may send: the store key adds a 16-character client scope and a `/`. */
export const MAX_KEY_BYTES = 200;

/** Headers that belong to one connection: never stored or replayed. */
export const HOP_BY_HOP = Object.freeze([
  'connection',
  'keep-alive',
  'proxy-connection',
  'proxy-authenticate',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
]);

const TITLES = {
  'idempotency-key-missing': 'Idempotency-Key is missing',
  'idempotency-key-malformed': 'Idempotency-Key is malformed',
  'idempotency-key-mismatch': 'Idempotency-Key is already used for another request',
  'idempotency-key-in-flight': 'A request with this Idempotency-Key is being processed',
  'store-unavailable': 'The idempotency store is unavailable',
  'body-too-large': 'Request body too large',
  'bad-request': 'Bad request',
  'response-not-recorded': 'The request ran but its response could not be recorded',
  'response-too-large': 'The request ran; its response was too large to keep',
  'upstream-timeout': 'The upstream timed out',
};

const STATUS = {
  'idempotency-key-missing': 400,
  'idempotency-key-malformed': 400,
  'bad-request': 400,
  'idempotency-key-mismatch': 422,
  'idempotency-key-in-flight': 409,
  'store-unavailable': 503,
  'response-not-recorded': 503,
  'body-too-large': 413,
  'response-too-large': 502,
  'upstream-timeout': 504,
};

/**
 * A problem (RFC 9457) as the gateway renders it: `{ status, headers, body }`
 * with `content-type: application/problem+json` and, where a retry may work,
 * `retry-after` in whole seconds.
 */
export function problem(slug, detail, retryAfterSecs) {
  const status = STATUS[slug];
  const body = JSON.stringify({ type: `https://idem.dev/problems/${slug}`, title: TITLES[slug], status, detail });
  const headers = [['content-type', 'application/problem+json']];
  if (retryAfterSecs !== undefined) headers.push(['retry-after', String(retryAfterSecs)]);
  return { status, headers, body: Buffer.from(body) };
}

/**
 * The key in one `Idempotency-Key` value: a structured-field string (`"…"`,
 * escaping only `"` and `\`) or a bare token of visible ASCII; 1 to 200
 * bytes once unquoted. Returns `{ key }` or `{ error }` (why, for a 400).
 * `raw` is the header as Node decodes it (latin1: one char per byte).
 */
export function idempotencyKey(raw) {
  let key = '';
  if (raw.startsWith('"')) {
    if (raw.length < 2 || !raw.endsWith('"')) return { error: "the quoted key has no closing '\"'" };
    const inner = raw.slice(1, -1);
    for (let i = 0; i < inner.length; i++) {
      const c = inner.charCodeAt(i);
      if (c === 0x5c) {
        const next = inner[++i];
        if (next !== '"' && next !== '\\') return { error: "a quoted key may only escape '\"' and '\\'" };
        key += next;
      } else if (c === 0x22) {
        return { error: "a quoted key contains an unescaped '\"'" };
      } else if (c >= 0x20 && c <= 0x7e) {
        key += inner[i];
      } else {
        return { error: `the key contains byte 0x${hex2(c)}; keys are printable ASCII` };
      }
    }
  } else {
    for (let i = 0; i < raw.length; i++) {
      const c = raw.charCodeAt(i);
      if (c <= 0x20 || c >= 0x7f) {
        return {
          error: `the key contains byte 0x${hex2(c)}; an unquoted key is visible ASCII without spaces (quote it as a structured-field string otherwise)`,
        };
      }
    }
    key = raw;
  }
  if (key.length === 0) return { error: `the key is empty; keys are 1 to ${MAX_KEY_BYTES} bytes` };
  if (key.length > MAX_KEY_BYTES) return { error: `the key is ${key.length} bytes; the limit is ${MAX_KEY_BYTES}` };
  return { key };
}

const hex2 = (c) => (c & 0xff).toString(16).padStart(2, '0');

/**
 * The store key, as the gateway builds it: the first 16 hex digits of the
 * SHA-256 of the client header's value (`anon` without one), `/`, the key.
 * One client never sees another's response, and no secret is stored.
 */
export function scopedKey(client, key) {
  const scope = client === undefined ? 'anon' : createHash('sha256').update(Buffer.from(client, 'latin1')).digest('hex').slice(0, 16);
  return `${scope}/${key}`;
}

const NONE = Object.freeze([]);

/**
 * Every value of each header in `names` (lower case), in order, from one
 * pass over Node's `rawHeaders` (which keeps duplicates that `req.headers`
 * joins or drops): an object name → values. Without `rawHeaders` (a request
 * that is not Node's), from `req.headers`.
 */
function headerValues(req, names) {
  const out = {};
  for (const name of names) out[name] = NONE;
  const raw = req.rawHeaders;
  if (!Array.isArray(raw)) {
    for (const name of names) {
      const v = req.headers[name];
      if (v !== undefined) out[name] = Array.isArray(v) ? v : [v];
    }
    return out;
  }
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i];
    for (const wanted of names) {
      if (name.length === wanted.length && name.toLowerCase() === wanted) {
        out[wanted] = out[wanted] === NONE ? [raw[i + 1]] : [...out[wanted], raw[i + 1]];
        break;
      }
    }
  }
  return out;
}

/** Thrown from the route's run to release the key with this response (a 5xx not stored). */
class Unstored extends Error {
  constructor(response) {
    super(`the handler answered ${response.status}; not stored`);
    this.response = response;
  }
}

/** Thrown when the route did not answer within the timeout: the key is released. */
class TimedOut extends Error {}

/**
 * The middleware. Options (defaults are the gateway's):
 *
 * - `guard` (required): a `Guard`.
 * - `requireKey` (false): answer 400 to a guarded request without a key; otherwise it passes through unguarded.
 * - `methods` (`['POST', 'PATCH']`): the guarded methods; others pass through.
 * - `keyHeader` (`idempotency-key`), `replayHeader` (`idempotent-replayed`).
 * - `expiryHeader` (`idempotency-expires`): on every response that is stored (the first, once
 *   completed, and each replay), until when the key replays it: an HTTP-date, the stored record's
 *   `expiresAtMs` rounded down to the second.
 * - `fingerprintHeaders` (`['content-type']`): headers that are part of the fingerprint besides method, path with query, and body.
 * - `clientHeader` (`authorization`, or null for one scope): keys are scoped by a hash of its value.
 * - `maxRequestBytes` (1 MiB): a larger body is 413, nothing claimed.
 * - `storeServerErrors` (false): store a route's 5xx too, instead of releasing the key.
 * - `timeoutMs` (20 000): a route that has not ended its response by then gets a 504; the key is released.
 * - `parseBody` (default: JSON for `application/json` and `+json`, else the Buffer): what `req.body` becomes
 *   when the middleware read the body itself (a parser that throws makes the answer a 400, nothing claimed).
 * - `storeBeforeRoute` (false): store a client error (4xx) written before the request reached an Express route
 *   (see the module's comment) instead of passing it through and releasing the key.
 * - `allowProcessLocalStore` (false): accept a guard over MemoryStore in a `node:cluster` worker, where each
 *   worker would keep keys of its own (refused by default: a repeat that reaches another worker would run again).
 */
export function idempotency({
  guard,
  requireKey = false,
  methods = ['POST', 'PATCH'],
  keyHeader = 'idempotency-key',
  replayHeader = 'idempotent-replayed',
  expiryHeader = 'idempotency-expires',
  fingerprintHeaders = ['content-type'],
  clientHeader = 'authorization',
  maxRequestBytes = 1 << 20,
  storeServerErrors = false,
  timeoutMs = 20_000,
  parseBody = jsonOrRaw,
  storeBeforeRoute = false,
  allowProcessLocalStore = false,
} = {}) {
  if (!guard) throw new TypeError('idempotency({ guard }): a Guard is required');
  if (cluster.isWorker && processLocal(guard.store) && !allowProcessLocalStore) {
    throw new Error(
      'idempotency(): the guard keeps its keys in this process (MemoryStore) and this is one of several node:cluster workers, ' +
        'so a repeat that reaches another worker would run again. Use a shared store (RedisStore, PostgresStore), ' +
        'or pass allowProcessLocalStore: true if each key always reaches the same worker.',
    );
  }
  const guarded = new Set(methods.map((m) => m.toUpperCase()));
  const keyName = keyHeader.toLowerCase();
  const printed = fingerprintHeaders.map((h) => h.toLowerCase());
  const clientName = clientHeader?.toLowerCase();
  // The headers each request is read for, in one pass.
  const wanted = [...new Set([keyName, ...(clientName ? [clientName] : []), ...printed])];
  const leaseSecs = Math.max(1, Math.ceil(Number(guard.policy.leaseMs) / 1000));
  const deadlines = new Deadlines(timeoutMs);

  return async function idempotencyMiddleware(req, res, next) {
    if (!guarded.has(req.method)) return next();
    const seen = headerValues(req, wanted);
    const sent = seen[keyName];
    if (sent.length === 0) {
      if (!requireKey) return next();
      return send(res, problem('idempotency-key-missing', `this endpoint requires an ${keyName} header`));
    }
    if (sent.length > 1) {
      return send(res, problem('idempotency-key-malformed', `more than one ${keyName} header; send exactly one`));
    }
    const parsed = idempotencyKey(sent[0]);
    if (parsed.error) return send(res, problem('idempotency-key-malformed', parsed.error));
    const client = clientName ? seen[clientName][0] : undefined;
    const key = scopedKey(client, parsed.key);

    const readHere = !Buffer.isBuffer(req.rawBody) && !Buffer.isBuffer(req.body);
    let body;
    try {
      body = await rawBody(req, maxRequestBytes);
    } catch (e) {
      if (e instanceof TooLarge) return send(res, problem('body-too-large', `the request body is over the limit of ${maxRequestBytes} bytes`));
      return next(e);
    }
    if (readHere) {
      try {
        req.body = parseBody(body, req);
      } catch (e) {
        return send(res, problem('bad-request', `the request body could not be parsed: ${e.message}`));
      }
    }

    const fp = fingerprint({
      method: req.method,
      path: req.originalUrl ?? req.url,
      headers: printed.flatMap((name) => seen[name].map((v) => [name, Buffer.from(v, 'latin1')])),
      body,
    });

    let result;
    let answered; // the route's answer, when it is what the guard stores
    try {
      result = await guard.run(key, fp, (fence) => {
        req.idempotency = { key: parsed.key, storeKey: key, fence };
        return runRoute(res, next, deadlines, (response) => {
          // A client error written before any route took the request (Express sets req.route as it dispatches to one).
          if (!storeBeforeRoute && response.status >= 400 && req.app !== undefined && req.route === undefined) throw new Unstored(response);
          if (response.status >= 500 && !storeServerErrors) throw new Unstored(response);
          if (size(response) > guard.policy.maxResponseBytes) {
            // The route ran; its answer is too large to keep, so this problem is
            // stored in its place and every repeat gets it: it never runs again.
            return problem(
              'response-too-large',
              `the handler ran the request, but its response was over the limit of ${guard.policy.maxResponseBytes} bytes (body plus headers) and was not kept; the key is done and this answer is what every repeat gets, so the request is never run again`,
            );
          }
          answered = response;
          return response;
        });
      });
    } catch (e) {
      if (e instanceof Unstored) return send(res, e.response);
      if (e instanceof TimedOut) return send(res, problem('upstream-timeout', `the handler did not answer within ${timeoutMs} ms`));
      if (e instanceof NotRecordedError) {
        // Why (a store error, a taken-over claim) is the guard logger's; the client learns what to do.
        return send(
          res,
          problem(
            'response-not-recorded',
            `the request ran, but its outcome could not be recorded, so it is not given out: a replay could contradict it. Retry after ${leaseSecs} s: the retry gets the recorded outcome, or, once the key's lease has run out, runs the request again`,
            leaseSecs,
          ),
        );
      }
      if (e instanceof GuardError && e.kind === 'invalid-input') return send(res, problem('idempotency-key-malformed', e.detail));
      return next(e);
    }
    switch (result.outcome) {
      case 'executed': {
        const expiry = expiryOf(expiryHeader, result);
        // The stored response is the route's own (the same body) unless it was replaced by a problem.
        if (answered !== undefined && result.response.body === answered.body) return sendAsWritten(res, result.response, expiry);
        return send(res, result.response, expiry);
      }
      case 'replayed':
        return send(res, result.response, [[replayHeader, 'true'], ...expiryOf(expiryHeader, result)]);
      case 'in-flight': {
        const secs = Math.max(1, Math.ceil(result.retryAfterMs / 1000));
        return send(
          res,
          problem('idempotency-key-in-flight', `retry after ${result.retryAfterMs} ms, when the first request has finished or its lease has run out`, secs),
        );
      }
      case 'conflict':
        return send(
          res,
          problem(
            'idempotency-key-mismatch',
            'the key was first used with another method, path, body or fingerprinted header; use a new key for a new request',
          ),
        );
      default:
        // The store's name and error are the guard logger's (Guard.load({ logger })), never the client's.
        return send(res, problem('store-unavailable', 'the request was not run: its outcome could not be checked. Retry after 1 s', 1));
    }
  };
}

class TooLarge extends Error {}

/**
 * An instant (ms since the epoch) as an HTTP-date (RFC 9110's IMF-fixdate,
 * `Sun, 06 Nov 1994 08:49:37 GMT`), rounded down to the second: a client
 * told the expiry never thinks a retry safe after the key is gone.
 */
export function httpDate(ms) {
  return new Date(Math.floor(ms / 1000) * 1000).toUTCString();
}

/** The expiry header of a stored response's outcome: `[[name, HTTP-date]]`, or none when the guard did not say. */
function expiryOf(name, { expiresAtMs }) {
  return expiresAtMs === undefined ? [] : [[name, httpDate(expiresAtMs)]];
}

/** `req.body` as express.json() would make it for JSON content types (undefined when empty), else the raw Buffer. */
export function jsonOrRaw(raw, req) {
  const header = req.headers['content-type'];
  if (header === undefined) return raw;
  // The usual value as it comes, else the media type: before any `;`, trimmed, lower case.
  const type = header === 'application/json' ? header : String(header).split(';')[0].trim().toLowerCase();
  if (type === 'application/json' || type.endsWith('+json')) return raw.length ? JSON.parse(raw.toString('utf8')) : undefined;
  return raw;
}

/**
 * The request's raw body: from a body parser that ran before (`req.rawBody`
 * from a `verify` hook, or a Buffer `req.body` from `express.raw()`), else
 * read from the stream, at most `limit` bytes. Reading it marks the request
 * as parsed (`req._body`), so body parsers mounted after the middleware skip
 * it instead of failing on a consumed stream.
 */
async function rawBody(req, limit) {
  if (Buffer.isBuffer(req.rawBody)) return req.rawBody;
  if (Buffer.isBuffer(req.body)) return req.body;
  if (req._body || req.readableEnded) {
    throw new Error(
      'idempotency: the request body was read before the middleware: mount it before body parsers, or keep the raw bytes with express.json({ verify: keepRawBody })',
    );
  }
  req.rawBody = await readAll(req, limit);
  req._body = true;
  return req.rawBody;
}

/**
 * The stream's bytes, at most `limit` (over it: a TooLarge rejection, and the
 * rest is read and dropped, so the connection can carry the answer). Plain
 * listeners: an async iterator over the request cost more than the guard's
 * own work for a small body (measured, BENCHMARKS.md).
 */
function readAll(req, limit) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    let length = 0;
    const onData = (chunk) => {
      if (length > limit) return;
      length += chunk.length;
      if (length > limit) {
        chunks.length = 0;
        reject(new TooLarge());
      } else {
        chunks.push(chunk);
      }
    };
    const onEnd = () => {
      done();
      if (length <= limit) resolve(chunks.length === 1 ? chunks[0] : Buffer.concat(chunks, length));
    };
    const onError = (e) => {
      done();
      reject(e);
    };
    const done = () => {
      req.off('data', onData);
      req.off('end', onEnd);
      req.off('error', onError);
      req.off('close', onClose);
    };
    // A client that goes away mid-body: no 'end' will come.
    const onClose = () => {
      if (!req.complete) onError(new Error('the client closed the connection before the request body ended'));
    };
    req.on('data', onData);
    req.on('end', onEnd);
    req.on('error', onError);
    req.on('close', onClose);
  });
}

/** A body parser's `verify` hook that keeps the raw bytes where the middleware looks for them. */
export function keepRawBody(req, _res, buf) {
  req.rawBody = Buffer.from(buf);
}

/**
 * The routes running under one middleware, each to be timed out `everyMs`
 * after it started: one timer for all of them (armed for the oldest, the
 * first due, since all share one timeout), not a timer per request. Due
 * times are on the monotonic clock, so a step of the wall clock moves no
 * deadline. The timer is unref'd: it never keeps the process alive.
 */
class Deadlines {
  #everyMs;
  /** Insertion order is start order, so the first entry is always the first due. */
  #running = new Set();
  #timer = null;

  constructor(everyMs) {
    this.#everyMs = everyMs;
  }

  /** Watches a route; `expire()` is called if it is still running `everyMs` from now. */
  add(expire) {
    const watch = { due: monotonicMs() + this.#everyMs, expire };
    this.#running.add(watch);
    if (this.#timer === null) this.#arm(this.#everyMs);
    return watch;
  }

  remove(watch) {
    this.#running.delete(watch);
  }

  #arm(ms) {
    this.#timer = setTimeout(() => this.#fire(), Math.max(1, ms));
    this.#timer.unref?.();
  }

  #fire() {
    this.#timer = null;
    const now = monotonicMs();
    for (const watch of this.#running) {
      if (watch.due > now) return this.#arm(watch.due - now);
      this.#running.delete(watch);
      watch.expire();
    }
  }
}

/**
 * Calls the rest of the chain with `res` capturing what the route writes:
 * nothing reaches the client until the claim is settled. Resolves to
 * `settle(response)` once the route has ended its response.
 */
function runRoute(res, next, deadlines, settle) {
  return new Promise((resolve, reject) => {
    // Put back as own properties holding the same functions, never deleted:
    // `delete` would turn `res` into a slow dictionary object for the rest of
    // the request (measured: the biggest cost of the middleware before).
    const saved = [res.writeHead, res.write, res.end, res.flushHeaders];
    const restore = () => {
      res.writeHead = saved[0];
      res.write = saved[1];
      res.end = saved[2];
      res.flushHeaders = saved[3];
    };
    const chunks = [];
    let done = false;
    const finish = (outcome) => {
      if (done) return;
      done = true;
      deadlines.remove(watch);
      restore();
      outcome();
    };
    const watch = deadlines.add(() => finish(() => reject(new TimedOut())));
    const chunk = (data, encoding) => {
      if (data === undefined || data === null || typeof data === 'function') return;
      chunks.push(Buffer.isBuffer(data) ? data : typeof data === 'string' ? Buffer.from(data, encoding || 'utf8') : Buffer.from(data));
    };
    res.writeHead = function writeHead(status, message, headers) {
      if (typeof message !== 'string') headers = message;
      else res.statusMessage = message;
      res.statusCode = status;
      if (Array.isArray(headers)) {
        // [[name, value], …] or the raw flat [name, value, name, value, …]
        const pairs = Array.isArray(headers[0]) ? headers : headers.flatMap((v, i) => (i % 2 ? [] : [[v, headers[i + 1]]]));
        for (const [name, value] of pairs) res.appendHeader(name, value);
      } else if (headers) {
        for (const [name, value] of Object.entries(headers)) res.setHeader(name, value);
      }
      return res;
    };
    res.flushHeaders = () => {};
    res.write = function write(data, encoding, cb) {
      if (done) return false;
      chunk(data, typeof encoding === 'string' ? encoding : undefined);
      const callback = typeof encoding === 'function' ? encoding : cb;
      if (callback) process.nextTick(callback);
      return true;
    };
    res.end = function end(data, encoding, cb) {
      if (done) return res;
      chunk(data, typeof encoding === 'string' ? encoding : undefined);
      const callback = [data, encoding, cb].find((a) => typeof a === 'function');
      const response = captured(res, chunks.length === 1 ? chunks[0] : Buffer.concat(chunks));
      finish(() => {
        try {
          resolve(settle(response));
        } catch (e) {
          reject(e);
        }
      });
      if (callback) process.nextTick(callback);
      return res;
    };
    try {
      next();
    } catch (e) {
      finish(() => reject(e));
    }
  });
}

/** What the route wrote: status, its headers less the hop-by-hop ones (names lower case), the body. */
function captured(res, body) {
  const headers = [];
  for (const name of res.getHeaderNames()) {
    if (HOP_BY_HOP.includes(name)) continue;
    const value = res.getHeader(name);
    for (const v of Array.isArray(value) ? value : [value]) headers.push([name, Buffer.from(String(v), 'latin1')]);
  }
  return { status: res.statusCode, headers, body };
}

/** The bytes counted against the guard's `maxResponseBytes`: the body, and each header's name and value. */
function size({ headers, body }) {
  return headers.reduce((n, [name, value]) => n + name.length + value.length, body.length);
}

/** Bytes as a Buffer over the same memory (no copy). */
const buffer = (bytes) => (Buffer.isBuffer(bytes) ? bytes : Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength));

/** A header value as Node writes it: bytes as latin-1, one char per byte. */
const latin1 = (value) => (typeof value === 'string' ? value : buffer(value).latin1Slice(0, value.length));

/** Writes a response (stored or a problem) on the real `res`, replacing any headers the route set. */
function send(res, { status, headers = [], body }, extra) {
  if (res.headersSent) return res.end();
  for (const name of res.getHeaderNames()) res.removeHeader(name);
  res.statusCode = status;
  for (const [name, value] of headers) res.appendHeader(name, latin1(value));
  if (extra !== undefined) for (const [name, value] of extra) res.appendHeader(name, value);
  return res.end(body === undefined || body === null ? '' : buffer(body));
}

/**
 * Sends the route's own answer, just stored: its headers are on `res`
 * already (the route set them), so only the hop-by-hop ones go, as they
 * never reach the store; `extra` headers are added.
 */
function sendAsWritten(res, { status, body }, extra) {
  if (res.headersSent) return res.end();
  for (const name of HOP_BY_HOP) if (res.hasHeader(name)) res.removeHeader(name);
  for (const [name, value] of extra) res.appendHeader(name, value);
  res.statusCode = status;
  return res.end(buffer(body));
}
