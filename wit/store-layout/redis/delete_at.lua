-- Deletes the record only if it is live at ARGV[2] (now_ms) and, unless
-- ARGV[1] is empty, at the version ARGV[1]. An absent key, an expired
-- record or another version is left alone, and so is a key holding another
-- Redis type. A value whose header does not decode (corrupt) is deleted only
-- when ARGV[1] is empty. KEYS[1]: the key. Returns 1 or 0.
-- 41: the last byte a header "{version} {expires_at_ms}\n" can use.
local head = redis.pcall('GETRANGE', KEYS[1], 0, 41)
if type(head) ~= 'string' or head == '' then return 0 end
local v, e = string.match(head, '^(%d+) (%d+)\n')
if not v then
  if ARGV[1] == '' then return redis.call('DEL', KEYS[1]) end
  return 0
end
if tonumber(e) <= tonumber(ARGV[2]) then return 0 end
if ARGV[1] ~= '' and v ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])
