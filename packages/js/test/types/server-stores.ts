// The network stores as a user types them, checked by `npx tsc`
// (tsconfig.json) in CI: each declares only what is its own and extends
// server-store.d.ts's `ServerStore` (the primitives, `async`, `clock`,
// `timeoutMs`, `delete`, `close`), so each must still type as all of it.

import type { AsyncGuard, AsyncStore, Entry, SyncedClock } from '@idem/guard';
import { Guard } from '@idem/guard';
import { DynamoDbStore } from '@idem/guard/dynamodb';
import { PostgresStore } from '@idem/guard/postgres';
import { RedisStore } from '@idem/guard/redis';

async function onServer(store: RedisStore | PostgresStore | DynamoDbStore): Promise<void> {
  const asynchronous: AsyncStore = store;
  const guard: AsyncGuard = Guard.load({ store });
  const clock: SyncedClock = store.clock;
  const timeoutMs: number = store.timeoutMs;
  const entry: Entry | undefined = await store.get('k', clock.nowMs());
  const deleted: boolean = await store.delete('k', entry?.version);
  void [asynchronous, guard, timeoutMs, deleted];
  await store.close();
}

export async function main(): Promise<void> {
  const redis = await RedisStore.open({ url: 'redis://127.0.0.1:6379' });
  const prefix: string = redis.prefix;
  const postgres = await PostgresStore.open({ url: 'postgres://postgres@127.0.0.1:5432/test' });
  const dynamodb = await DynamoDbStore.open({ endpoint: 'http://127.0.0.1:8000' });
  const purged: number = (await postgres.purgeExpired(0n, 10)) + (await dynamodb.purgeExpired(0n, 10));
  const tables: string[] = [postgres.table, dynamodb.table];
  void [prefix, purged, tables];
  for (const store of [redis, postgres, dynamodb]) await onServer(store);
}
