// An HTTP handler guarded by idem: POST /orders with an `Idempotency-Key`
// header charges once per key; a retry gets the stored response back byte
// for byte (marked `idempotent-replayed: true`), the same key with another
// body is 422, a retry while the first is running is 409 with Retry-After,
// and a failing store is 503 — nothing is charged unless the claim is held.
// A 503 tells the client to retry and when, never what the store is or how
// it failed: that goes to the log (`console.warn` here).
//
// Run as a server it keeps its keys in Redis (REDIS_URL, default
// redis://127.0.0.1:6379), so that several processes behind one port share
// them: a MemoryStore would let each process run a retry the others ran.
//
//   node http-server.js            # listens on PORT (default 8080)
//   curl -XPOST -H 'Idempotency-Key: o-1' -d '{"sku":"A"}' localhost:8080/orders

import { createServer } from 'node:http';
import { fileURLToPath } from 'node:url';
import { fingerprint, Guard, NotRecordedError } from '@idem/guard';
import { RedisStore } from '@idem/guard/redis';

async function readBody(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  return Buffer.concat(chunks);
}

/** The request handler; `charge(order, fence)` is the side effect to run once. */
export function ordersHandler(guard, charge) {
  return async (req, res) => {
    const key = req.headers['idempotency-key'];
    if (req.method !== 'POST' || req.url !== '/orders') return send(res, { status: 404, body: 'not found\n' });
    if (!key) return send(res, { status: 400, body: 'the Idempotency-Key header is required\n' });
    const body = await readBody(req);
    // Hashed natively: the body does not cross into the component.
    const fp = fingerprint({ method: req.method, path: req.url, body });
    try {
      const result = await guard.run(key, fp, async (fence) => {
        const receipt = await charge(JSON.parse(body.toString('utf8')), fence);
        return { status: 201, headers: [['content-type', 'application/json']], body: JSON.stringify(receipt) };
      });
      switch (result.outcome) {
        case 'executed':
          return send(res, result.response);
        case 'replayed':
          return send(res, result.response, [['idempotent-replayed', 'true']]);
        case 'in-flight':
          return send(res, { status: 409, headers: [['retry-after', String(Math.ceil(result.retryAfterMs / 1000))]], body: 'in flight\n' });
        case 'conflict':
          return send(res, { status: 422, body: 'this Idempotency-Key was used with another request\n' });
        default:
          console.warn(`idempotency store unavailable for ${key}: ${result.message}`); // for the operator only
          return send(res, { status: 503, headers: [['retry-after', '1']], body: 'not run: the idempotency store did not answer; retry in 1 s\n' });
      }
    } catch (e) {
      if (e instanceof NotRecordedError) {
        console.warn(`charged ${key}, but the receipt was not recorded: ${e.error.message}`);
        return send(res, { status: 503, headers: [['retry-after', '30']], body: 'the outcome is not recorded yet; retry in 30 s\n' });
      }
      return send(res, { status: e.kind === 'invalid-input' ? 400 : 500, body: e.kind === 'invalid-input' ? `${e.message}\n` : 'internal error\n' });
    }
  };
}

function send(res, { status, headers = [], body }, extra = []) {
  res.statusCode = status;
  for (const [name, value] of [...headers, ...extra]) res.appendHeader(name, Buffer.from(value));
  res.end(Buffer.from(body ?? ''));
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const store = await RedisStore.open({ url: process.env.REDIS_URL ?? 'redis://127.0.0.1:6379', prefix: 'orders:' });
  const guard = Guard.load({ store, leaseMs: 30_000, logger: console });
  let next = 1;
  const server = createServer(ordersHandler(guard, async (order) => ({ order: next++, ...order, charged: true })));
  server.listen(Number(process.env.PORT ?? 8080), () => console.log(`listening on ${server.address().port}`));
}
