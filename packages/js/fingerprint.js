// The canonical fingerprint of wit/guard.wit, computed natively with
// node:crypto: the same bytes the component's `fingerprint` returns (tested
// on every vector of conformance/fingerprint-vectors.json and on random
// requests in test/fingerprint.test.js), without passing the request into
// the component.
//
//   E    = P("idem-fingerprint-v1")
//   P(b) = the byte length of b as 8 bytes big-endian, then b
//   hash = sha256(E ‖ P(upper(method)) ‖ P(path) ‖ P(count as 8 bytes)
//                 ‖ (P(lower(name)) ‖ P(value))* sorted ‖ P(body))
//
// Case mapping is ASCII-only; headers are sorted by name, then value,
// byte-wise, duplicates kept.
//
// Written for the per-call cost (issue #43: within 1.2x one SHA-256 over the
// same bytes; BENCHMARKS.md): the whole message is written once into a
// scratch buffer this module keeps (the function is synchronous, so one
// buffer serves every call) and hashed in one call, `crypto.hash` where Node
// has it (20.12+). Short strings are written by a loop that also does the
// case mapping; longer ones by Buffer's UTF-8 writer. A message over
// SCRATCH_MAX bytes is not copied into the scratch buffer: its parts go to
// an incremental hash, the body as it is.

import * as crypto from 'node:crypto';

const DOMAIN = 'idem-fingerprint-v1';
/** The largest message written into the kept scratch buffer; a larger one is hashed part by part. */
const SCRATCH_MAX = 1 << 20;
/** Strings up to this many UTF-16 units are written by a JS loop; longer ones by Buffer's UTF-8 writer. */
const SHORT = 128;
const oneShot = typeof crypto.hash === 'function' ? crypto.hash : (alg, data, enc) => crypto.createHash(alg).update(data).digest(enc);
const EMPTY = new Uint8Array(0);

const NO_HEADERS = [];
/** Where the message goes on after P(DOMAIN), which the scratch buffer always starts with. */
const DOMAIN_END = 8 + DOMAIN.length;
let scratch = Buffer.alloc(0);
/** The longest message whose view of the scratch buffer is kept. */
const VIEWS_MAX = 4096;
/** Views of the scratch buffer's first n bytes, by n, for the buffer they view. */
let views = [];
/** A request's headers, lowered, and their sorted order, between two lines of `fingerprint` (which is synchronous). */
const names = [];
const values = [];
const sorted = [];
scratchFor(16 * 1024);

/** A value as a string or bytes; absent is empty. */
function bytesOf(v) {
  if (v === undefined || v === null) return EMPTY;
  if (typeof v === 'string' || v instanceof Uint8Array) return v;
  if (Array.isArray(v)) return Uint8Array.from(v);
  if (ArrayBuffer.isView(v)) return new Uint8Array(v.buffer, v.byteOffset, v.byteLength);
  if (v instanceof ArrayBuffer) return new Uint8Array(v);
  throw new TypeError(`expected a string or bytes, got ${typeof v}`);
}

/** The most bytes `v` (a string, as UTF-8, or bytes) takes: 3 per UTF-16 unit. */
const most = (v) => (typeof v === 'string' ? 3 * v.length : v.length);

/** `n` as 8 bytes big-endian at `at`. */
function putLength(buf, at, n) {
  const hi = n > 0xffffffff ? Math.floor(n / 0x1_0000_0000) : 0;
  buf[at] = hi >>> 24;
  buf[at + 1] = (hi >>> 16) & 0xff;
  buf[at + 2] = (hi >>> 8) & 0xff;
  buf[at + 3] = hi & 0xff;
  buf[at + 4] = n >>> 24;
  buf[at + 5] = (n >>> 16) & 0xff;
  buf[at + 6] = (n >>> 8) & 0xff;
  buf[at + 7] = n & 0xff;
}

/** P(s) for a string at `at`, as UTF-8; returns the end (see putMapped). */
function putString(buf, at, s) {
  return putMapped(buf, at, s, 0, 0);
}

/**
 * P(s) with the ASCII letters from `lo` to `lo + 25` shifted by `by`:
 * upper(method), lower(name); `by` 0 maps nothing. A short string is
 * written by a loop, char by char, which is exact when every char is ASCII
 * (all of them or'ed together below 0x80: one test after the loop, not one
 * per char); otherwise, and for a long string, Buffer's UTF-8 writer writes
 * it again, and the mapping is a second pass.
 */
function putMapped(buf, at, s, lo, by) {
  const start = at + 8;
  const chars = s.length;
  if (chars <= SHORT) {
    let all = 0;
    for (let i = 0; i < chars; i++) {
      const c = s.charCodeAt(i);
      all |= c;
      buf[start + i] = (c - lo) >>> 0 < 26 ? c + by : c;
    }
    if (all < 0x80) {
      putLength(buf, at, chars);
      return start + chars;
    }
  }
  const n = buf.utf8Write(s, start, buf.length - start);
  putLength(buf, at, n);
  if (by !== 0) shift(buf, start, start + n, lo, by);
  return start + n;
}

/** P(bytes) at `at`; returns the end. */
function putBytes(buf, at, v) {
  const n = v.length;
  putLength(buf, at, n);
  at += 8;
  if (n > 64) buf.set(v, at);
  else for (let i = 0; i < n; i++) buf[at + i] = v[i]; // a short value: a loop beats `set`'s fixed cost
  return at + n;
}

/** ASCII-only case mapping of `buf[from..to]` in place: bytes `lo`..`lo+25` shifted by `by`. */
function shift(buf, from, to, lo, by) {
  for (let i = from; i < to; i++) {
    const b = buf[i];
    if (b >= lo && b < lo + 26) buf[i] = b + by;
  }
}

/** Bytes as UTF-8 (a string) or as they are. */
const utf8 = (v) => (typeof v === 'string' ? Buffer.from(v, 'utf8') : v);

/** Byte order of two values, each a string or bytes. */
function compare(a, b) {
  if (typeof a === 'string' && typeof b === 'string' && isAscii(a) && isAscii(b)) return a < b ? -1 : a > b ? 1 : 0;
  return Buffer.compare(utf8(a), utf8(b));
}

/**
 * Byte order of two header names once lowered, each from `nameKey`: an ASCII
 * name as given, compared with A-Z mapped as it goes (no lowered copy), or
 * a non-ASCII one's lowered UTF-8 bytes.
 */
function compareNames(a, b) {
  if (typeof a !== 'string' || typeof b !== 'string') return Buffer.compare(lowered(a), lowered(b));
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) {
    let x = a.charCodeAt(i);
    let y = b.charCodeAt(i);
    if (x - 0x41 < 26 && x >= 0x41) x += 0x20;
    if (y - 0x41 < 26 && y >= 0x41) y += 0x20;
    if (x !== y) return x - y;
  }
  return a.length - b.length;
}

/** A header name's UTF-8 bytes lowered (ASCII only); bytes from `nameKey` are lowered already. */
function lowered(name) {
  if (typeof name !== 'string') return name;
  const b = Buffer.from(name, 'utf8');
  shift(b, 0, b.length, 0x41, 0x20);
  return b;
}

function isAscii(s) {
  for (let i = 0; i < s.length; i++) if (s.charCodeAt(i) > 0x7f) return false;
  return true;
}

/** A header name to sort and write: an ASCII name as it is (lowered as it is written), or a non-ASCII one's lowered UTF-8 bytes. */
const nameKey = (name) => (isAscii(name) ? name : lowered(name));

function checkName(name) {
  if (typeof name !== 'string') throw new TypeError(`expected a header name string, got ${typeof name}`);
  return name;
}

/** The first `n` bytes of the scratch buffer: a view kept per length (making one per call costs as much as writing a part). */
function viewOf(buf, n) {
  if (n > VIEWS_MAX) return new Uint8Array(buf.buffer, buf.byteOffset, n);
  let view = views[n];
  if (view === undefined) {
    view = new Uint8Array(buf.buffer, buf.byteOffset, n);
    views[n] = view;
  }
  return view;
}

/** The scratch buffer, at least `size` bytes, starting with P(DOMAIN). */
function scratchFor(size) {
  if (scratch.length < size) {
    scratch = Buffer.allocUnsafeSlow(Math.min(SCRATCH_MAX, Math.max(size, 2 * scratch.length)));
    putString(scratch, 0, DOMAIN);
    views = [];
  }
  return scratch;
}

/**
 * The canonical fingerprint (`sha256:` and 64 hex digits) of a request:
 * `{ method, path, headers?: [name, value][], body? }`, values and body as
 * strings (UTF-8) or bytes.
 */
export function fingerprint(request) {
  const method = request.method;
  const path = request.path;
  const headers = request.headers ?? NO_HEADERS;
  const b = bytesOf(request.body);
  if (typeof method !== 'string') throw new TypeError(`expected the method as a string, got ${typeof method}`);
  if (typeof path !== 'string') throw new TypeError(`expected the path as a string, got ${typeof path}`);
  const count = headers.length;
  let size = DOMAIN_END + 8 + 3 * method.length + 8 + 3 * path.length + 16 + 8 + (typeof b === 'string' ? 3 * b.length : b.length);
  // One header (the usual content-type) needs no sorting: it is written as it comes.
  let name0;
  let value0;
  if (count === 1) {
    const header = headers[0];
    name0 = checkName(header[0]);
    value0 = bytesOf(header[1]);
    size += 16 + 3 * name0.length + (typeof value0 === 'string' ? 3 * value0.length : value0.length);
  } else if (count > 1) {
    // Sorted by insertion into the kept arrays (a few headers: no pairs, no comparator closure).
    for (let i = 0; i < count; i++) {
      const header = headers[i];
      const name = nameKey(checkName(header[0]));
      const value = bytesOf(header[1]);
      size += 16 + most(name) + most(value);
      let j = i;
      for (; j > 0; j--) {
        const k = sorted[j - 1];
        if ((compareNames(names[k], name) || compare(values[k], value)) <= 0) break;
        sorted[j] = k;
      }
      sorted[j] = i;
      names[i] = name;
      values[i] = value;
    }
  }
  if (size > SCRATCH_MAX) {
    const pairs = count === 1 ? [[name0, value0]] : Array.from(sorted.slice(0, count), (k) => [names[k], values[k]]);
    for (let i = 0; i < count; i++) {
      names[i] = undefined;
      values[i] = undefined;
    }
    return partwise(method, path, pairs, b);
  }
  const buf = scratchFor(size);

  let at = putMapped(buf, DOMAIN_END, method, 0x61, -0x20); // upper(method)
  at = putString(buf, at, path);
  putLength(buf, at, 8);
  putLength(buf, at + 8, count);
  at += 16;
  if (count === 1) {
    at = putMapped(buf, at, name0, 0x41, 0x20); // lower(name)
    at = typeof value0 === 'string' ? putString(buf, at, value0) : putBytes(buf, at, value0);
  } else {
    for (let i = 0; i < count; i++) {
      const name = names[sorted[i]];
      const value = values[sorted[i]];
      at = typeof name === 'string' ? putMapped(buf, at, name, 0x41, 0x20) : putBytes(buf, at, name); // lower(name)
      at = typeof value === 'string' ? putString(buf, at, value) : putBytes(buf, at, value);
    }
    for (let i = 0; i < count; i++) {
      names[i] = undefined;
      values[i] = undefined;
    } // hold no request's parts after the call (keeping the arrays' room)
  }
  at = typeof b === 'string' ? putString(buf, at, b) : putBytes(buf, at, b);
  return `sha256:${oneShot('sha256', viewOf(buf, at), 'hex')}`;
}

/** The same hash for a message too large for the scratch buffer: each part fed to an incremental hash, nothing copied whole. */
function partwise(method, path, pairs, body) {
  const hash = crypto.createHash('sha256');
  const length = Buffer.alloc(8);
  const part = (v) => {
    const bytes = utf8(v);
    putLength(length, 0, bytes.length);
    hash.update(length);
    hash.update(bytes);
  };
  const upper = Buffer.from(method, 'utf8');
  shift(upper, 0, upper.length, 0x61, -0x20);
  part(DOMAIN);
  part(upper);
  part(path);
  const count = Buffer.alloc(8);
  putLength(count, 0, pairs.length);
  part(count);
  for (const [name, value] of pairs) {
    const lower = Buffer.from(utf8(name));
    shift(lower, 0, lower.length, 0x41, 0x20);
    part(lower);
    part(value);
  }
  part(body);
  return `sha256:${hash.digest('hex')}`;
}
