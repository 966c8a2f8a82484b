-- Deletes those of KEYS whose record expired at or before ARGV[1], at most
-- ARGV[2] of them. Returns how many it deleted.
-- 41: the last byte a header "{version} {expires_at_ms}\n" can use.
local n = 0
for _, k in ipairs(KEYS) do
  if n >= tonumber(ARGV[2]) then break end
  local head = redis.pcall('GETRANGE', k, 0, 41)
  if type(head) == 'string' then
    local e = string.match(head, '^%d+ (%d+)\n')
    if e and tonumber(e) <= tonumber(ARGV[1]) then n = n + redis.call('DEL', k) end
  end
end
return n
