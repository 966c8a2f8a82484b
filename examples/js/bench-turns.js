// What the Redis benchmarks (bench-stores.js, bench-peers.js) share: timing
// a row's calls over a range of keys, and removing the keys a run wrote.
//
//   const [wallUs, cpuUs] = await timed(0, 100, async (i) => store.get(`k${i}`, store.clock.nowMs()));
//   await removeKeys(new Redis(url), prefix);

/** Wall-clock and CPU microseconds `call` took over keys `from` to `to`. */
export async function timed(from, to, call) {
  const cpu = process.cpuUsage();
  const start = process.hrtime.bigint();
  for (let i = from; i < to; i++) await call(i);
  const wall = Number(process.hrtime.bigint() - start) / 1000;
  const used = process.cpuUsage(cpu);
  return [wall, used.user + used.system];
}

/**
 * Deletes, through the ioredis client `redis`, every key under `prefix` and
 * every key holding it: node-idempotency writes its own keys under its own
 * prefix, with ours inside.
 */
export async function removeKeys(redis, prefix) {
  for (const pattern of [`${prefix}*`, `*${prefix}*`]) {
    let cursor = '0';
    do {
      const [next, keys] = await redis.scan(cursor, 'MATCH', pattern, 'COUNT', 5000);
      if (keys.length) await redis.del(...keys);
      cursor = next;
    } while (cursor !== '0');
  }
}
