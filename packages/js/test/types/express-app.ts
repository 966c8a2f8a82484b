import express, { type Request, type Response } from 'express';
import { Guard } from '@idem/guard';
import { idempotency } from '@idem/guard/express';

interface Order { sku: string; qty: number }

const app = express();
const guard = Guard.load();
app.use(idempotency({ guard, requireKey: true }));
app.post('/orders', (req: Request<{}, unknown, Order>, res: Response) => {
  const qty: number = req.body.qty;
  res.status(201).json({ qty, fence: String(req.idempotency?.fence) });
});
app.post('/inline', idempotency({ guard }), (req, res) => {
  const sku: string = req.body.sku;
  res.json({ sku });
});
