-- Deletes the record only at the version ARGV[1]; a key that holds no
-- record (or another type) is left alone. KEYS[1]: the key. Returns 1 or 0.
-- 41: the last byte a header "{version} {expires_at_ms}\n" can use.
local head = redis.pcall('GETRANGE', KEYS[1], 0, 41)
if type(head) ~= 'string' or string.match(head, '^(%d+) ') ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])
