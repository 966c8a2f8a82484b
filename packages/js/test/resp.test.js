// RedisStore's own connection (resp.js): the bytes it writes, every reply
// shape it reads (whole, in pieces, several at once), a server that sends
// what is not RESP, a record far larger than one read, AUTH and SELECT from
// the URL, a connection lost with a command in flight (failed, not resent)
// or while idle (the next command opens a new one), a script the server lost
// (NOSCRIPT: loaded again), and TLS (`rediss://`) through a TLS proxy with a
// certificate of the test's own.
// The scripted servers need nothing; the rest needs IDEM_TEST_REDIS_URL.

import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import tls from 'node:tls';
import { Guard, StoreError } from '../index.js';
import { encodeValue, RedisStore } from '../redis.js';
import { Connection, ConnectionError, pack, parseUrl, ReplyError } from '../resp.js';
import { serverUrl, skipWithout, unique } from '../testing/netstores.js';

const REDIS = 'IDEM_TEST_REDIS_URL';
const closers = [];
after(() => {
  for (const close of closers) close();
});

// --- the bytes ------------------------------------------------------------------

test('pack writes one RESP array of bulk strings: UTF-8 for strings, bytes as they are', () => {
  const binary = Buffer.from([0x0d, 0x0a, 0x00, 0xff]);
  const long = 'k'.repeat(70);
  const longUtf8 = 'é'.repeat(40); // past the byte-by-byte path: 80 bytes of UTF-8
  assert.equal(
    pack(['SET', 'clé', binary, '12', long, longUtf8]).toString('latin1'),
    `*6\r\n$3\r\nSET\r\n$4\r\ncl\xc3\xa9\r\n$4\r\n\r\n\x00\xff\r\n$2\r\n12\r\n$70\r\n${long}\r\n$80\r\n${Buffer.from(longUtf8).toString('latin1')}\r\n`,
  );
  assert.equal(pack([]).toString('latin1'), '*0\r\n');
  assert.equal(pack(['']).toString('latin1'), '*1\r\n$0\r\n\r\n');
});

test('parseUrl takes user, password, database and rediss; a URL it cannot use is refused naming what is wrong', () => {
  assert.deepEqual(parseUrl('redis://127.0.0.1:6379'), { host: '127.0.0.1', port: 6379, username: '', password: '', db: 0, tls: false });
  assert.deepEqual(parseUrl('rediss://al%40ice:p%3Ass@cache.internal/7'), {
    host: 'cache.internal',
    port: 6379,
    username: 'al@ice',
    password: 'p:ss',
    db: 7,
    tls: true,
  });
  assert.deepEqual(parseUrl('redis://:secret@[::1]:7000'), { host: '::1', port: 7000, username: '', password: 'secret', db: 0, tls: false });
  assert.throws(() => parseUrl('http://127.0.0.1'), /scheme "http" is not redis or rediss/);
  assert.throws(() => parseUrl('redis://127.0.0.1/zero'), /database "zero" is not a number/);
  assert.throws(() => parseUrl('redis://127.0.0.1/?db=1'), /takes no query/);
  assert.throws(() => parseUrl('not a url'), /is not a URL/);
});

// --- a scripted server ------------------------------------------------------------

/**
 * A server on 127.0.0.1 that answers each command with the next of
 * `replies` (bytes, written in `pieces`-byte writes), recording the commands
 * it got (as the raw bytes of each read) and how many connections it saw.
 */
async function scripted(replies, { pieces = 0 } = {}) {
  const got = [];
  let connections = 0;
  const sockets = new Set();
  const server = net.createServer((socket) => {
    connections += 1;
    sockets.add(socket);
    socket.on('error', () => {});
    socket.on('data', async (d) => {
      got.push(d.toString('latin1'));
      const reply = replies.shift();
      if (reply === undefined) return; // silent: a server that stopped answering
      if (reply === 'close') return socket.destroy();
      if (!pieces) return socket.write(reply);
      for (let i = 0; i < reply.length; i += pieces) {
        socket.write(reply.subarray(i, i + pieces));
        await new Promise((resolve) => setImmediate(resolve));
      }
    });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const close = () => {
    for (const s of sockets) s.destroy();
    server.close();
  };
  closers.push(close);
  return { port: server.address().port, got, replies, connections: () => connections, close };
}

const b = (text) => Buffer.from(text, 'latin1');
const open = (port, options = {}) => Connection.open(parseUrl(`redis://127.0.0.1:${port}`), { timeoutMs: 500, ...options });

/** `TIME`'s reply through time.lua, as RedisStore reads the server's clock at open: 1 765 000 000 123 ms. */
const TIME = b('*2\r\n$10\r\n1765000000\r\n$6\r\n123456\r\n');
/** A scripted store reads the server's clock once, at open: no read a second later takes a reply the test scripted. */
const ONCE = { clockSyncMs: 3_600_000 };

test('every reply shape is read, whole and one byte at a time', async () => {
  const replies = [
    '+OK\r\n',
    ':-42\r\n',
    ':18446744073709551615\r\n',
    '$5\r\nhe\r\no\r\n',
    '$-1\r\n',
    '$0\r\n\r\n',
    '*3\r\n:1\r\n$-1\r\n*2\r\n$1\r\na\r\n+b\r\n',
    '*-1\r\n',
    '-ERR unknown command\r\n',
    '+still in step\r\n',
  ];
  const expected = [
    'OK',
    -42,
    18446744073709551615n,
    b('he\r\no'),
    null,
    b(''),
    [1, null, [b('a'), 'b']],
    null,
    new ReplyError('ERR unknown command'),
    'still in step',
  ];
  for (const pieces of [0, 1]) {
    const server = await scripted(replies.map(b), { pieces });
    const conn = await open(server.port);
    for (const want of expected) {
      const reply = await conn.send(pack(['PING']));
      if (want instanceof ReplyError) {
        assert.ok(reply instanceof ReplyError, `${pieces}: an error reply is a ReplyError value`);
        assert.equal(reply.message, want.message);
      } else {
        assert.deepEqual(reply, want, `pieces ${pieces}`);
      }
    }
    assert.equal(conn.dead, null, 'an error reply leaves the connection up');
    conn.close();
    server.close();
  }
});

test('replies to commands sent together are matched to them in order, even when they arrive in one read', async () => {
  const server = await scripted([b(':1\r\n:2\r\n:3\r\n')]);
  const conn = await open(server.port);
  const replies = await Promise.all([1, 2, 3].map(() => conn.send(pack(['INCR', 'n']))));
  assert.deepEqual(replies, [1, 2, 3]);
  conn.close();
  server.close();
});

test('a server that sends what is not RESP kills the connection: the command fails, and so does every later one on it', async () => {
  for (const bad of ['HTTP/1.1 400 Bad Request\r\n', ':12x\r\n', '$-2\r\n', '+OK\rX\n', '$536870913\r\n', '*1025\r\n']) {
    const server = await scripted([b(bad)]);
    const conn = await open(server.port);
    await assert.rejects(conn.send(pack(['PING'])), (e) => e instanceof ConnectionError && /the server sent/.test(e.message), bad);
    assert.match(conn.dead, /the server sent/);
    await assert.rejects(conn.send(pack(['PING'])), ConnectionError);
    server.close();
  }
});

test('a command unanswered for timeoutMs fails, with those behind it, and the connection is dead', async () => {
  const server = await scripted([]);
  const conn = await open(server.port, { timeoutMs: 150 });
  const started = performance.now();
  const first = conn.send(pack(['PING']));
  const second = conn.send(pack(['PING']));
  await assert.rejects(first, /no answer within 150 ms/);
  await assert.rejects(second, /no answer within 150 ms/);
  assert.ok(performance.now() - started >= 140, 'not before its time');
  assert.equal(conn.dead, 'no answer within 150 ms');
  server.close();
});

test('AUTH and SELECT come from the URL, before any command; a refused AUTH fails the open naming the reply', async () => {
  const server = await scripted([b('+OK\r\n'), b('+OK\r\n'), b('+PONG\r\n')]);
  const conn = await Connection.open(parseUrl(`redis://alice:s3cret@127.0.0.1:${server.port}/5`), { timeoutMs: 500 });
  assert.equal(await conn.send(pack(['PING'])), 'PONG');
  assert.deepEqual(server.got, ['*3\r\n$4\r\nAUTH\r\n$5\r\nalice\r\n$6\r\ns3cret\r\n', '*2\r\n$6\r\nSELECT\r\n$1\r\n5\r\n', '*1\r\n$4\r\nPING\r\n']);
  conn.close();
  server.close();

  const refusing = await scripted([b('-WRONGPASS invalid username-password pair or user is disabled.\r\n')]);
  await assert.rejects(
    RedisStore.open({ url: `redis://:nope@127.0.0.1:${refusing.port}`, timeoutMs: 500 }),
    /redis store: cannot open redis:\/\/:\*\*\*@127\.0\.0\.1:\d+: WRONGPASS/,
  );
  refusing.close();
});

test('RedisStore: an error reply such as READONLY fails the call unavailable and the next command connects afresh; NOSCRIPT does not', async () => {
  const sha = (name) => b(`$40\r\n${'0'.repeat(39)}${name}\r\n`);
  const server = await scripted([
    sha(1),
    sha(2),
    sha(3),
    sha(4), // SCRIPT LOAD at open
    TIME, // the server's clock, at open
    b("-READONLY You can't write against a read only replica.\r\n"),
    b('$-1\r\n'), // the GET after it, on a new connection
    b('-NOSCRIPT No matching script.\r\n'),
    b(`$40\r\n${'0'.repeat(40)}\r\n`),
    b(':0\r\n'), // a replace that reloads its script
  ]);
  const store = await RedisStore.open({ url: `redis://127.0.0.1:${server.port}`, timeoutMs: 500, cas: 'script', ...ONCE }); // no IFEQ probe
  assert.equal(store.clock.unknown(), null);
  assert.ok(
    server.got[4].startsWith('*4\r\n$7\r\nEVALSHA\r\n') && server.got[4].endsWith('\r\n$1\r\n1\r\n$6\r\n\u0001clock\r\n'),
    'time.lua on "{prefix}\\x01clock"',
  );
  const now = 1_000_000n;
  await assert.rejects(
    store.insert('k', record(now), now),
    (e) => e instanceof StoreError && e.payload.tag === 'unavailable' && /READONLY/.test(e.payload.val),
  );
  assert.equal(await store.get('k', now), undefined);
  assert.equal(server.connections(), 2, 'READONLY retired the connection');
  assert.equal(await store.replace('k', 1n, record(now), now), false);
  assert.equal(server.connections(), 2, 'NOSCRIPT is answered on the same connection');
  assert.match(server.got.at(-3), /^\*8\r\n\$7\r\nEVALSHA\r\n/);
  assert.match(server.got.at(-2), /^\*3\r\n\$6\r\nSCRIPT\r\n\$4\r\nLOAD\r\n/);
  assert.match(server.got.at(-1), /^\*8\r\n\$7\r\nEVALSHA\r\n/);
  await store.close();
  server.close();
});

test("RedisStore reads the server's clock at open and every clockSyncMs after, following a step of it; a clock it cannot read fails the open", async () => {
  const sha = b(`$40\r\n${'0'.repeat(40)}\r\n`);
  const hourLater = b('*2\r\n$10\r\n1765003600\r\n$6\r\n123456\r\n');
  const server = await scripted([sha, sha, sha, sha, TIME, hourLater]);
  const store = await RedisStore.open({ url: `redis://127.0.0.1:${server.port}`, prefix: 'p:', timeoutMs: 500, cas: 'script', clockSyncMs: 100 });
  try {
    const first = Number(store.clock.nowMs());
    // The server answered 1 765 000 000 123 ms within the round trip; the monotonic clock carries it on from there.
    assert.ok(first >= 1_765_000_000_123 - 500 && first < 1_765_000_000_123 + 5_000, String(first));
    assert.equal(store.timeoutMs, 500);
    // The next read, a period later, finds the server's clock an hour on: followed, and counted as a step.
    for (const start = performance.now(); store.clock.steps === 0; await new Promise((resolve) => setTimeout(resolve, 10))) {
      if (performance.now() - start > 10_000) assert.fail('the second reading was not taken within 10 s');
    }
    assert.ok(Math.abs(store.clock.lastStepMs - 3_600_000) < 5_000, String(store.clock.lastStepMs));
    assert.ok(Number(store.clock.nowMs()) >= 1_765_003_600_123 - 500, String(store.clock.nowMs()));
  } finally {
    await store.close();
    server.close();
  }

  const broken = await scripted([sha, sha, sha, sha, b('-ERR TIME is not allowed from scripts\r\n')]);
  await assert.rejects(
    RedisStore.open({ url: `redis://127.0.0.1:${broken.port}`, timeoutMs: 500, cas: 'script' }),
    /redis store: cannot open redis:\/\/127\.0\.0\.1:\d+: the Redis server's clock \(TIME\) has not been read yet \(reading it failed: redis store: ERR TIME is not allowed/,
  );
  broken.close();
  await assert.rejects(RedisStore.open({ clockSyncMs: 99 }), /clockSyncMs 99 must be a whole number of milliseconds from 100 to 3600000/);
});

test('RedisStore on a server with SET … IFEQ completes a claim it knows the bytes of with that one command; cas: script, or a server without it, runs the script', async () => {
  const sha = b(`$40\r\n${'0'.repeat(40)}\r\n`);
  const now = 1_000_000n;
  const claim = record(now);
  const claimed = encodeValue(1n, claim);
  const renewed = { ...claim, leaseUntilMs: now + 2_000n };
  // Valkey: the probe answers nil; the clock; the claim (nil: inserted), a renewal (+OK), a second one refused (nil).
  const valkey = await scripted([sha, sha, sha, sha, b('$-1\r\n'), TIME, b('$-1\r\n'), b('+OK\r\n'), b('$-1\r\n')]);
  const store = await RedisStore.open({ url: `redis://127.0.0.1:${valkey.port}`, prefix: 'p:', timeoutMs: 500, ...ONCE });
  assert.equal(store.nativeCas, true);
  assert.equal(valkey.got[4], '*5\r\n$3\r\nSET\r\n$13\r\np:\u0001ifeq-probe\r\n$5\r\nprobe\r\n$4\r\nIFEQ\r\n$5\r\nprobe\r\n');
  assert.ok(valkey.got[5].startsWith('*4\r\n$7\r\nEVALSHA\r\n') && valkey.got[5].endsWith('$8\r\np:\u0001clock\r\n'), "the clock, on the prefix's clock key");
  assert.deepEqual(await store.insert('k', claim, now), { tag: 'inserted', val: 1n });
  assert.equal(await store.replace('k', 1n, renewed, now), true);
  const ttl = String(claim.expiresAtMs - now + 60_000n);
  assert.equal(valkey.got[7], pack(['SET', 'p:k', encodeValue(2n, renewed), 'IFEQ', claimed, 'PX', ttl]).toString('latin1'), 'SET new IFEQ old PX ttl');
  // The server refuses (another writer changed the bytes): not written, and the next replace of that version runs the script.
  assert.equal(await store.replace('k', 2n, { ...renewed, leaseUntilMs: now + 3_000n }, now), false);
  assert.match(valkey.got[8], /IFEQ/);
  // Bytes it no longer knows (taken out by the refused attempt): the script.
  const script = scriptedReply(valkey, b(':0\r\n'));
  assert.equal(await store.replace('k', 2n, renewed, now), false);
  assert.match(script(), /^\*8\r\n\$7\r\nEVALSHA\r\n/);
  await store.close();
  valkey.close();

  for (const [name, probe, options] of [
    ['Redis 7', [b('-ERR syntax error\r\n')], {}],
    ['cas: script', [], { cas: 'script' }],
  ]) {
    const server = await scripted([sha, sha, sha, sha, ...probe, TIME, b('$-1\r\n'), b(':1\r\n')]);
    const other = await RedisStore.open({ url: `redis://127.0.0.1:${server.port}`, timeoutMs: 500, ...ONCE, ...options });
    assert.equal(other.nativeCas, false, name);
    await other.insert('k', claim, now);
    assert.equal(await other.replace('k', 1n, renewed, now), true, name);
    assert.match(server.got.at(-1), /^\*8\r\n\$7\r\nEVALSHA\r\n/, name);
    assert.equal(server.got.length, 4 + probe.length + 1 + 2, `${name}: no probe with cas: script`);
    await other.close();
    server.close();
  }
  await assert.rejects(RedisStore.open({ cas: 'ifeq' }), /cas "ifeq" is not one of auto, script/);
});

/** Queues `reply` as `server`'s next answer; returns a function that gives the command it answered. */
function scriptedReply(server, reply) {
  server.replies.push(reply);
  const at = server.got.length;
  return () => server.got[at];
}

test('RedisStore: a URL it cannot use is refused at open, naming the problem', async () => {
  await assert.rejects(
    RedisStore.open({ url: 'http://127.0.0.1:6379' }),
    /redis store: cannot open http:\/\/127\.0\.0\.1:6379: the URL's scheme "http" is not redis or rediss/,
  );
  const closed = await scripted([]);
  closed.close();
  await assert.rejects(
    RedisStore.open({ url: `redis://127.0.0.1:${closed.port}`, timeoutMs: 300 }),
    /redis store: cannot open redis:\/\/127\.0\.0\.1:\d+: (connect ECONNREFUSED|cannot connect)/,
  );
});

// --- on the live server ------------------------------------------------------------

/**
 * A TCP proxy to the test server (TLS to its clients with `secure`) that
 * counts connections and commands, can stop passing replies on (`hold()`)
 * and can cut every connection (`cut()`).
 */
async function proxy(upstreamPort, { secure } = {}) {
  const sockets = new Set();
  let connections = 0;
  let held = false;
  const commands = [];
  const onClient = (client) => {
    connections += 1;
    const upstream = net.connect(upstreamPort, '127.0.0.1');
    sockets.add(client).add(upstream);
    client.on('data', (d) => {
      commands.push(d.toString('latin1'));
      upstream.write(d);
    });
    upstream.on('data', (d) => held || client.write(d));
    for (const s of [client, upstream]) s.on('error', () => {}).on('close', () => (client.destroy(), upstream.destroy()));
  };
  const server = secure ? tls.createServer(secure, onClient) : net.createServer(onClient);
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const cut = () => {
    for (const s of sockets) s.destroy();
    sockets.clear();
  };
  const close = () => {
    cut();
    server.close();
  };
  closers.push(close);
  const hold = () => (held = true);
  return { port: server.address().port, connections: () => connections, commands, hold, cut, close };
}

const live = () => new URL(serverUrl(REDIS));
const record = (nowMs) => ({ fingerprint: 'fp', state: 'processing', holder: 7n, leaseUntilMs: nowMs + 1000n, expiresAtMs: nowMs + 60_000n });
const until = async (done) => {
  for (let i = 0; i < 200 && !done(); i++) await new Promise((resolve) => setTimeout(resolve, 5));
};

test('RedisStore: a connection cut while idle is replaced by the next command; one cut with a command in flight fails it unavailable, unsent again', {
  skip: skipWithout(REDIS),
}, async () => {
  const url = live();
  const p = await proxy(Number(url.port || 6379));
  url.host = `127.0.0.1:${p.port}`;
  const store = await RedisStore.open({ url: url.href, prefix: `${unique()}:` });
  const now = 1_000_000n;
  try {
    assert.deepEqual(await store.insert('a', record(now), now), { tag: 'inserted', val: 1n });
    p.cut(); // on loopback the close is in the client's kernel buffer when this returns
    await new Promise((resolve) => setTimeout(resolve, 20)); // a turn of the event loop reads it
    assert.equal((await store.get('a', now)).version, 1n, 'the next command after an idle cut opens a new connection');
    assert.equal(p.connections(), 2);

    // In flight: the proxy has passed the command on and the connection dies before the reply comes back.
    const sent = p.commands.length;
    p.hold();
    const pending = store.get('a', now);
    await until(() => p.commands.length > sent);
    p.cut();
    await assert.rejects(pending, (e) => e instanceof StoreError && e.payload.tag === 'unavailable' && /redis store: /.test(e.payload.val));
    assert.equal(p.commands.length, sent + 1, 'the failed command is not resent');
  } finally {
    await store.delete('a', undefined, now).catch(() => {});
    await store.close();
    p.close();
  }
});

test('RedisStore: a record far larger than one read (1 MiB of body through a 64 KiB read buffer) comes back byte for byte', {
  skip: skipWithout(REDIS),
}, async () => {
  const store = await RedisStore.open({ url: serverUrl(REDIS), prefix: `${unique()}:` });
  const now = 1_000_000n;
  const body = new Uint8Array(1 << 20).map((_, i) => (i * 7919) % 251);
  const done = { ...record(now), state: 'done', response: { status: 200, headers: [['x-a', new Uint8Array([0x0d, 0x0a])]], body } };
  try {
    await store.insert('big', record(now), now);
    assert.equal(await store.replace('big', 1n, done, now), true);
    // Two reads at once: their replies share reads, and each is matched to its command.
    const [a, b] = await Promise.all([store.get('big', now), store.get('big', now)]);
    for (const entry of [a, b]) assert.deepEqual(entry, { record: done, version: 2n });
  } finally {
    await store.delete('big', undefined, now);
    await store.close();
  }
});

test('RedisStore: the database of the URL is the one written; a script the server lost is loaded again (NOSCRIPT)', { skip: skipWithout(REDIS) }, async () => {
  const url = live();
  url.pathname = '/3';
  const prefix = `${unique()}:`;
  const store = await RedisStore.open({ url: url.href, prefix });
  const { Redis } = await import('ioredis');
  const db3 = new Redis(url.href);
  const db0 = new Redis(serverUrl(REDIS));
  const now = 1_000_000n;
  try {
    await store.insert('k', record(now), now);
    assert.equal(await db0.exists(`${prefix}k`), 0);
    assert.equal(await db3.exists(`${prefix}k`), 1);
    // Other stores on this server reload it too, the same way.
    await db3.script('FLUSH');
    assert.equal(await store.replace('k', 1n, { ...record(now), state: 'done' }, now), true);
    assert.equal((await store.get('k', now)).record.state, 'done');
  } finally {
    await db3.del(`${prefix}k`);
    db3.disconnect();
    db0.disconnect();
    await store.close();
  }
});

test('RedisStore over TLS (rediss://): a guarded call runs once and replays; a certificate it does not trust fails the open', {
  skip: skipWithout(REDIS),
}, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'idem-tls-'));
  closers.push(() => rmSync(dir, { recursive: true, force: true }));
  execFileSync(
    'openssl',
    [
      'req',
      '-x509',
      '-newkey',
      'rsa:2048',
      '-nodes',
      '-days',
      '1',
      '-subj',
      '/CN=localhost',
      '-addext',
      'subjectAltName=DNS:localhost',
      '-keyout',
      join(dir, 'key.pem'),
      '-out',
      join(dir, 'cert.pem'),
    ],
    { stdio: 'ignore' },
  );
  const cert = readFileSync(join(dir, 'cert.pem'));
  const p = await proxy(Number(live().port || 6379), { secure: { key: readFileSync(join(dir, 'key.pem')), cert } });
  const url = `rediss://localhost:${p.port}`;
  const prefix = `${unique()}:`;
  const store = await RedisStore.open({ url, prefix, tls: { ca: cert } });
  try {
    const guard = Guard.load({ store });
    let runs = 0;
    const handler = async () => ((runs += 1), { status: 201, body: 'over tls' });
    const first = await guard.run('order', 'fp', handler);
    const again = await guard.run('order', 'fp', handler);
    assert.deepEqual([first.outcome, again.outcome, runs], ['executed', 'replayed', 1]);
    assert.equal(Buffer.from(again.response.body).toString(), 'over tls');
  } finally {
    await store.delete('order');
    await store.close();
  }
  await assert.rejects(RedisStore.open({ url, prefix, timeoutMs: 1000 }), /redis store: cannot open rediss:\/\/localhost:\d+: self[- ]signed certificate/);
  // The proxy speaks only TLS: a plain connection to it gets no answer.
  await assert.rejects(RedisStore.open({ url: `redis://localhost:${p.port}`, prefix, timeoutMs: 300 }), /redis store: cannot open redis:\/\/localhost:\d+: /);
});

test('RedisStore on Valkey: a guarded call with a checkpoint completes with SET … IFEQ and runs no script; bytes another writer changed are refused', {
  skip: skipWithout('IDEM_TEST_VALKEY_URL'),
}, async () => {
  const valkey = new URL(serverUrl('IDEM_TEST_VALKEY_URL'));
  const p = await proxy(Number(valkey.port || 6379));
  const url = new URL(valkey.href);
  url.host = `127.0.0.1:${p.port}`;
  const prefix = `${unique()}:`;
  const store = await RedisStore.open({ url: url.href, prefix });
  const { Redis } = await import('ioredis');
  const raw = new Redis(valkey.href);
  try {
    assert.equal(store.nativeCas, true);
    const opened = p.commands.length;
    const guard = Guard.load({ store });
    let runs = 0;
    const handler = async (fence, attempt) => {
      runs += 1;
      await attempt.saveCheckpoint('charged', 'ch-1');
      return { status: 201, body: 'paid' };
    };
    const first = await guard.run('order', 'fp', handler);
    const again = await guard.run('order', 'fp', handler);
    assert.deepEqual([first.outcome, again.outcome, runs], ['executed', 'replayed', 1]);
    const sent = p.commands.slice(opened).join('');
    assert.equal((sent.match(/IFEQ/g) ?? []).length, 2, 'the checkpoint and the completion');
    assert.ok(!sent.includes('EVALSHA'), 'no script');

    // Another writer's bytes at the same version (a host that claimed the key after it was dropped): refused.
    const now = store.clock.nowMs();
    const claim = record(now);
    assert.deepEqual(await store.insert('k', claim, now), { tag: 'inserted', val: 1n });
    const theirs = encodeValue(1n, { ...claim, holder: 99n });
    await raw.set(`${prefix}k`, theirs, 'PX', 60_000);
    assert.equal(await store.replace('k', 1n, { ...claim, state: 'done', response: { status: 200, headers: [], body: new Uint8Array() } }, now), false);
    assert.deepEqual(await raw.getBuffer(`${prefix}k`), theirs);
  } finally {
    await raw.del(`${prefix}order`, `${prefix}k`);
    raw.disconnect();
    await store.close();
  }
});
