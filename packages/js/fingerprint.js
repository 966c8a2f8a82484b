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

import { createHash } from 'node:crypto';

const encoder = new TextEncoder();

/** A string as UTF-8, or the bytes as they are. */
function toBytes(v) {
  if (v === undefined || v === null) return new Uint8Array();
  return typeof v === 'string' ? encoder.encode(v) : Uint8Array.from(v);
}

function u64be(n) {
  const b = Buffer.alloc(8);
  b.writeBigUInt64BE(BigInt(n));
  return b;
}

/** ASCII-only case mapping of UTF-8 bytes: `from`..`from+25` shifted by `by`. */
function asciiShift(bytes, from, by) {
  return Uint8Array.from(bytes, (b) => (b >= from && b < from + 26 ? b + by : b));
}

function compareBytes(a, b) {
  return Buffer.compare(Buffer.from(a), Buffer.from(b));
}

/**
 * The canonical fingerprint (`sha256:` and 64 hex digits) of a request:
 * `{ method, path, headers?: [name, value][], body? }`, values and body as
 * strings (UTF-8) or bytes.
 */
export function fingerprint({ method, path, headers = [], body }) {
  const hash = createHash('sha256');
  const part = (bytes) => {
    hash.update(u64be(bytes.length));
    hash.update(bytes);
  };
  const pairs = headers
    .map(([name, value]) => [asciiShift(encoder.encode(name), 0x41, 0x20), toBytes(value)])
    .sort((x, y) => compareBytes(x[0], y[0]) || compareBytes(x[1], y[1]));
  part(encoder.encode('idem-fingerprint-v1'));
  part(asciiShift(encoder.encode(method), 0x61, -0x20));
  part(encoder.encode(path));
  part(u64be(pairs.length));
  for (const [name, value] of pairs) {
    part(name);
    part(value);
  }
  part(toBytes(body));
  return `sha256:${hash.digest('hex')}`;
}
