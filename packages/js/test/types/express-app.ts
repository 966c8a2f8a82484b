// A typed Express 5 application as a user writes one, type-checked by
// `npx tsc` (tsconfig.json) in CI: the shared store, the logger and metrics
// hooks, the route's typed body, and `req.idempotency` from the
// `Express.Request` augmentation. Before issue #46, TypeScript refused the
// route (TS2339: no `idempotency` on Request) and the inline mount
// (TS18046: `req.body` is unknown).

import type { DecisionEvent, Logger } from '@idem/guard';
import { Guard, MemoryStore } from '@idem/guard';
import { idempotency, keepRawBody } from '@idem/guard/express';
import { RedisStore } from '@idem/guard/redis';
import express, { type NextFunction, type Request, type Response } from 'express';

interface Order {
  sku: string;
  qty: number;
}

const counts = new Map<string, number>();
const onDecision = (event: DecisionEvent): void => {
  counts.set(event.outcome, (counts.get(event.outcome) ?? 0) + 1);
  const fence: bigint | undefined = event.fence;
  void [fence, event.ms, event.decision, event.reason];
};
const logger: Logger = console;

export async function main(): Promise<void> {
  const store = await RedisStore.open({ url: 'redis://127.0.0.1:6379', prefix: 'shop:' });
  const guard = Guard.load({ store, logger, onDecision, tracing: true });
  const app = express();

  // App-wide, before the body parsers: `req.body` is the parsed JSON, typed by the route.
  app.use(idempotency({ guard, requireKey: true, storeBeforeRoute: false }));
  app.post('/orders', (req: Request<Record<string, string>, unknown, Order>, res: Response) => {
    const qty: number = req.body.qty;
    const fence: bigint | undefined = req.idempotency?.fence;
    // @ts-expect-error an unguarded request has no idempotency: it may be undefined
    void req.idempotency.fence;
    res.status(201).json({ qty, fence: String(fence) });
  });

  // Inline, after a body parser that keeps the raw bytes: the handler's body keeps its type.
  app.post('/inline', express.json({ verify: keepRawBody }), idempotency({ guard }), (req: Request<Record<string, string>, unknown, Order>, res) => {
    const sku: string = req.body.sku;
    // @ts-expect-error the body is an Order: no such field
    void req.body.price;
    res.json({ sku, key: req.idempotency?.key });
  });

  // Inline with no types of its own: req.body is Express's default (any), not unknown.
  app.post('/untyped', idempotency({ guard }), (req, res) => {
    const sku: string = req.body.sku;
    res.json({ sku });
  });

  // Error middleware and `next` keep their Express types too.
  app.use((err: unknown, _req: Request, res: Response, next: NextFunction) => {
    if (res.headersSent) return next(err);
    res.status(500).end();
  });

  // @ts-expect-error a logger's methods take (message, fields)
  Guard.load({ store: new MemoryStore(), logger: { warn: (n: number) => n } });
  // @ts-expect-error onDecision is a function
  Guard.load({ onDecision: 'metrics' });
  await store.close();
}
