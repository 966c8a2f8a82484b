-- Claims a key whose record expired by the guard's clock while Redis still
-- holds it (its grace period): overwrites it at its version + 1 unless a
-- concurrent claimer made it live meanwhile.
-- KEYS[1]: the key. ARGV: now_ms, the PX ttl, expires_at_ms, the value after
-- the header. Returns {0, version} when written, {1, value} when a live
-- record holds the key, {2} when the stored header does not decode.
local ver = 0
local cur = redis.call('GET', KEYS[1])
if cur then
  local v, e = string.match(cur, '^(%d+) (%d+)\n')
  if not v then return {2} end
  if tonumber(e) > tonumber(ARGV[1]) then return {1, cur} end
  ver = tonumber(v)
end
ver = ver + 1
redis.call('SET', KEYS[1], string.format('%d %s\n', ver, ARGV[3]) .. ARGV[4], 'PX', ARGV[2])
return {0, ver}
