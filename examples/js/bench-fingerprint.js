// What `fingerprint(request)` costs next to one SHA-256 over the same bytes
// (issue #43: within 1.2x). For each request shape, the rows take turns in
// blocks within each round (the order reversed every other round), so a busy
// machine slows them alike; each row's CPU time per call (this process's:
// on a machine shared with other work, wall-clock time also counts the
// waits for a core) is printed for the median round, and each row over
// the fastest SHA-256 of the very message the fingerprint hashes (prebuilt,
// so the baseline does no encoding at all: `crypto.hash` where Node has it).
//
//   node bench-fingerprint.js [OPS] [ROUNDS] [--before FILE]
//
// `--before FILE` adds a row for another fingerprint module (e.g. an older
// fingerprint.js checked out to /tmp) measured in the same run.
//
// The floor row is what any fingerprint() must do at the least, by the least
// code: write the request's parts, each after its length prefix, behind a
// P(DOMAIN) written once, into a kept buffer, then one `crypto.hash` over a
// kept view of it and the `sha256:` prefix — with no checks, the case
// mapping and the sort of the headers done once outside the timed loop, and
// strings taken to be ASCII. Over the SHA-256 row it is the cost of getting
// the parts of a request, as JS hands them over, into one message.

import * as crypto from 'node:crypto';
import { pathToFileURL } from 'node:url';
import { fingerprint } from '@idem/guard';

const args = process.argv.slice(2);
const beforeAt = args.indexOf('--before');
const before = beforeAt >= 0 ? (await import(pathToFileURL(args.splice(beforeAt, 2)[1]).href)).fingerprint : null;
const ops = Number(args[0] ?? 200_000);
const rounds = Number(args[1] ?? 5);

/** The canonical message of wit/guard.wit for a request with ASCII parts (what the fingerprint hashes). */
function message({ method, path, headers, body }) {
  const p = (b) => {
    const n = Buffer.alloc(8);
    n.writeBigUInt64BE(BigInt(b.length));
    return [n, b];
  };
  const count = Buffer.alloc(8);
  count.writeBigUInt64BE(BigInt(headers.length));
  const sorted = headers.map(([n, v]) => [Buffer.from(n.toLowerCase()), Buffer.from(v)]).sort((x, y) => Buffer.compare(x[0], y[0]) || Buffer.compare(x[1], y[1]));
  return Buffer.concat([
    ...p(Buffer.from('idem-fingerprint-v1')),
    ...p(Buffer.from(method.toUpperCase())),
    ...p(Buffer.from(path)),
    ...p(count),
    ...sorted.flatMap(([n, v]) => [...p(n), ...p(v)]),
    ...p(Buffer.from(body)),
  ]);
}

const json = '{"sku":"A-100","qty":1,"cents":1000,"currency":"EUR"}';
const shapes = {
  'JSON body (52 B string)': { method: 'POST', path: '/orders?src=web', headers: [['content-type', 'application/json']], body: json, ops },
  'JSON body (52 B Buffer)': { method: 'POST', path: '/orders?src=web', headers: [['content-type', 'application/json']], body: Buffer.from(json), ops },
  '1 KiB body, 3 headers': {
    method: 'PATCH',
    path: '/orders/o-1',
    headers: [['Content-Type', 'application/json'], ['X-Tenant', 't-42'], ['Accept', '*/*']],
    body: crypto.randomBytes(1024),
    ops,
  },
  '64 KiB body': { method: 'POST', path: '/upload', headers: [['content-type', 'application/octet-stream']], body: crypto.randomBytes(65536), ops: Math.ceil(ops / 50) },
};

/** The floor: `request`'s message written by the least code, then hashed (see the head of this file). */
function leastCode({ method, path, headers, body }) {
  const parts = [method.toUpperCase(), path, null];
  for (const [n, v] of headers.map(([n, v]) => [n.toLowerCase(), v]).sort((x, y) => Buffer.compare(Buffer.from(x[0]), Buffer.from(y[0])) || Buffer.compare(Buffer.from(x[1]), Buffer.from(y[1])))) parts.push(n, v);
  parts.push(body);
  const buf = Buffer.alloc(65 * 1024 + 4096);
  buf[7] = 19;
  buf.latin1Write('idem-fingerprint-v1', 8);
  const views = [];
  const count = headers.length;
  const hash = crypto.hash ?? ((alg, data, enc) => crypto.createHash(alg).update(data).digest(enc));
  return () => {
    let at = 27;
    for (const part of parts) {
      if (part === null) {
        buf[at + 7] = 8;
        buf[at + 15] = count;
        at += 16;
        continue;
      }
      const n = part.length;
      buf[at + 4] = n >>> 24;
      buf[at + 5] = (n >>> 16) & 0xff;
      buf[at + 6] = (n >>> 8) & 0xff;
      buf[at + 7] = n & 0xff;
      at += 8;
      if (typeof part === 'string') for (let i = 0; i < n; i++) buf[at + i] = part.charCodeAt(i);
      else if (n > 64) buf.set(part, at);
      else for (let i = 0; i < n; i++) buf[at + i] = part[i];
      at += n;
    }
    return `sha256:${hash('sha256', (views[at] ??= new Uint8Array(buf.buffer, buf.byteOffset, at)), 'hex')}`;
  };
}

const oneShot = typeof crypto.hash === 'function' ? (m) => crypto.hash('sha256', m, 'hex') : null;
const results = {};
let sink = 0;
for (const [shape, request] of Object.entries(shapes)) {
  const bytes = message(request);
  const expected = `sha256:${crypto.createHash('sha256').update(bytes).digest('hex')}`;
  if (fingerprint(request) !== expected) throw new Error(`${shape}: the prebuilt message is not what fingerprint() hashes`);
  const floor = leastCode(request);
  if (floor() !== expected) throw new Error(`${shape}: the floor writes another message`);
  const rows = {
    'fingerprint(request)': () => fingerprint(request),
    'floor: the message by the least code': floor,
    'createHash(sha256) over the message': () => crypto.createHash('sha256').update(bytes).digest('hex'),
  };
  if (oneShot) rows['crypto.hash(sha256) over the message'] = () => oneShot(bytes);
  if (before) rows['before: fingerprint(request)'] = () => before(request);
  const n = request.ops;
  const block = Math.max(1, Math.floor(n / 20));
  results[shape] = Object.fromEntries(Object.keys(rows).map((r) => [r, []]));
  for (const fn of Object.values(rows)) for (let i = 0; i < n; i++) sink += fn().length; // warm-up: optimized code for every row
  for (let round = 0; round < rounds; round++) {
    const order = round % 2 ? Object.keys(rows).reverse() : Object.keys(rows);
    const spent = Object.fromEntries(order.map((r) => [r, 0]));
    for (let start = 0; start < n; start += block) {
      for (const r of order) {
        const fn = rows[r];
        const cpu = process.cpuUsage();
        for (let i = start; i < Math.min(n, start + block); i++) sink += fn().length;
        const { user, system } = process.cpuUsage(cpu);
        spent[r] += user + system;
      }
    }
    for (const r of order) results[shape][r].push((spent[r] * 1000) / n);
  }
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const load = (await import('node:fs')).readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');
console.log(`node ${process.version}, ${rounds} rounds, load average ${load}${sink ? '' : ' '}`);
for (const [shape, rows] of Object.entries(results)) {
  const floor = Math.min(...Object.entries(rows).filter(([r]) => r.includes('over the message')).map(([, t]) => median(t)));
  console.log(`${shape} (${shapes[shape].ops} ops):`);
  for (const [row, times] of Object.entries(rows)) {
    console.log(`  ${row.padEnd(40)} ${median(times).toFixed(0).padStart(8)} cpu-ns/op  ${(median(times) / floor).toFixed(2)}x one SHA-256 over the same bytes`);
  }
}
