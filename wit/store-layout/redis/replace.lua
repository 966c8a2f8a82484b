-- Sets the new value only if the record is live at the expected version.
-- KEYS[1]: the key. ARGV: expected version, now_ms, the PX ttl, the new
-- value (its header already at the expected version + 1).
-- Returns 1 when written, 0 when not, -1 when the stored header does not decode.
-- 41: the last byte a header "{version} {expires_at_ms}\n" can use.
local head = redis.call('GETRANGE', KEYS[1], 0, 41)
if head == '' then return 0 end
local v, e = string.match(head, '^(%d+) (%d+)\n')
if not v then return -1 end
if v ~= ARGV[1] or tonumber(e) <= tonumber(ARGV[2]) then return 0 end
redis.call('SET', KEYS[1], ARGV[4], 'PX', ARGV[3])
return 1
