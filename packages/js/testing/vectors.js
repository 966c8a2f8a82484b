// The on-store layout's vectors (wit/store-layout/vectors.json, from an
// independent encoder) as the store tests read them: test/netstores.test.js
// (Redis, PostgreSQL) and test/dynamodb.test.js. Not part of the package (not
// in package.json `files`), and outside test/ so `node --test test/` does not
// run it as a test file.

import { readFileSync } from 'node:fs';

export const vectors = JSON.parse(readFileSync(new URL('../../../wit/store-layout/vectors.json', import.meta.url), 'utf8'));

/** Hex as bytes. */
export const u8 = (h) => new Uint8Array(Buffer.from(h, 'hex'));

/** A record of vectors.json as the store primitives take and return it. */
export function record(r) {
  const out = {
    fingerprint: r.fingerprint,
    state: r.state,
    holder: BigInt(r.holder),
    leaseUntilMs: BigInt(r.lease_until_ms),
    expiresAtMs: BigInt(r.expires_at_ms),
  };
  if (r.response) out.response = { status: r.response.status, headers: r.response.headers.map(([n, v]) => [n, u8(v)]), body: u8(r.response.body) };
  if (r.checkpoint) out.checkpoint = { phase: r.checkpoint.phase, data: u8(r.checkpoint.data) };
  return out;
}
