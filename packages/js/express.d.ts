// Types of @idem/guard/express (express.js). The middleware works on Node's
// own request and response; the types ask only for what it reads, so they
// need neither @types/express nor @types/node, and an Express app's
// req/res fit them.
//
// Two things make them hold in a typed Express app (test/types/ is such an
// app, type-checked in CI):
// - `Express.Request` is augmented with `idempotency` (below), so a route
//   reads `req.idempotency?.fence` without a cast (an unguarded request —
//   a GET, or one without a key when keys are optional — has none);
// - `RequestLike` names no `body`: mounted inline
//   (`app.post('/orders', idempotency({ guard }), handler)`), the middleware
//   gives TypeScript nothing to infer the route's body type from, so
//   `req.body` keeps Express's default (`any`) or the type the handler
//   declares, instead of becoming `unknown`.

import type { AsyncGuard, Guard } from './index.js';

declare global {
  namespace Express {
    interface Request {
      /**
       * Set by `idempotency()` on a guarded request before the route runs: the
       * client's key, the store key, the claim's fence. Absent on a request
       * the middleware passes through unguarded.
       */
      idempotency?: IdempotencyInfo;
    }
  }
}

/** What the middleware reads from a request (an Express or Node request has all of it). */
export interface RequestLike {
  method?: string;
  url?: string;
  originalUrl?: string;
  headers: Record<string, string | string[] | undefined>;
  /** Set on a guarded request for the route: the client's key, the store key, the claim's fence. */
  idempotency?: IdempotencyInfo;
  /** The raw request body, as the middleware read and fingerprinted it. */
  rawBody?: Uint8Array;
}

export interface IdempotencyOptions {
  /** The guard, over any store (an `AsyncGuard` over RedisStore or PostgresStore too): its store, lease, retention and `maxResponseBytes` (the stored-response cap, body plus headers). */
  guard: Guard | AsyncGuard;
  /** Answer 400 to a guarded request without a key (default false: it passes through unguarded). */
  requireKey?: boolean;
  /** The guarded methods (default POST, PATCH); others pass through. */
  methods?: string[];
  /** Default `idempotency-key`. */
  keyHeader?: string;
  /** Added to replayed responses with the value `true` (default `idempotent-replayed`). */
  replayHeader?: string;
  /**
   * Added to every response that is stored (the first, once completed, and
   * each replay; never to a 4xx or 5xx of the middleware's own, nor to a
   * response not stored): until when the key replays it, an HTTP-date of
   * the stored record's `expiresAtMs` rounded down to the second (default
   * `idempotency-expires`).
   */
  expiryHeader?: string;
  /** Headers in the fingerprint besides method, path with query, and body (default `['content-type']`). */
  fingerprintHeaders?: string[];
  /** Keys are scoped by a hash of this header's value (default `authorization`; null: one scope). */
  clientHeader?: string | null;
  /** A larger request body is 413 and nothing is claimed (default 1 MiB). */
  maxRequestBytes?: number;
  /** Store the route's 5xx responses too, instead of releasing the key (default false). */
  storeServerErrors?: boolean;
  /** A route that has not ended its response by then gets a 504 and the key is released (default 20 000). */
  timeoutMs?: number;
  /** What `req.body` becomes when the middleware read the body itself (default `jsonOrRaw`); throwing makes the answer a 400. */
  parseBody?: (raw: Uint8Array, req: RequestLike) => unknown;
  /**
   * Store a client error (4xx) written before the request reached an Express
   * route (a 404 for no route; the refusal of authentication, a rate limiter
   * or validation mounted app-wide after the middleware) instead of passing
   * it through and releasing the key (default false).
   */
  storeBeforeRoute?: boolean;
  /** Accept a guard over MemoryStore in a `node:cluster` worker (refused by default: each worker would keep keys of its own). */
  allowProcessLocalStore?: boolean;
}

/** What a guarded request carries for the route: the client's key, the store key, the claim's fence. */
export interface IdempotencyInfo {
  key: string;
  storeKey: string;
  fence: bigint;
}

/** A response as the middleware stores, replays or refuses with. */
export interface HttpAnswer {
  status: number;
  headers: [name: string, value: string | Uint8Array][];
  body: Uint8Array;
}

/** A connect-style middleware; `res` is Node's `ServerResponse` (or Express's, which extends it). */
export type Middleware = (req: RequestLike, res: object, next: (err?: unknown) => void) => Promise<void>;

/** The middleware, with the `idem serve` gateway's semantics. Mount it before body parsers. */
export declare function idempotency(options: IdempotencyOptions): Middleware;

/** A body parser's `verify` hook that keeps the raw bytes for the middleware: `express.json({ verify: keepRawBody })`. */
export declare function keepRawBody(req: RequestLike, res: object, buf: Uint8Array): void;

/** `req.body` as express.json() makes it for `application/json` and `+json` (undefined when empty), else the raw bytes. */
export declare function jsonOrRaw(raw: Uint8Array, req: RequestLike): unknown;

/** The key in one `Idempotency-Key` value (`{ key }`), or why it is not one (`{ error }`). */
export declare function idempotencyKey(raw: string): { key: string; error?: undefined } | { key?: undefined; error: string };

/** The store key, as the gateway builds it: a 16-hex-digit hash of the client header (or `anon`), `/`, the key. */
export declare function scopedKey(client: string | undefined, key: string): string;

/** An instant (ms since the epoch) as an HTTP-date (IMF-fixdate, `Sun, 06 Nov 1994 08:49:37 GMT`), rounded down to the second. */
export declare function httpDate(ms: number): string;

/** A problem+json answer as the gateway renders it. */
export declare function problem(slug: string, detail: string, retryAfterSecs?: number): HttpAnswer;

/** The longest key a client may send (200 bytes). */
export declare const MAX_KEY_BYTES: number;

/** Headers never stored or replayed. */
export declare const HOP_BY_HOP: readonly string[];
