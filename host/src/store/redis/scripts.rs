//! The Lua scripts, for what no native command does atomically.

use super::value::HEADER_MAX;
use redis::{Cmd, Script};
use std::sync::LazyLock;

/// Overwrites an expired record at its version + 1, or returns the live one
/// that a concurrent claimer wrote meanwhile: `{0, version}` or `{1, value}`;
/// `{2}` when the header does not decode.
/// ARGV: now, ttl, expires_at_ms, the value after the header.
pub(super) static CLAIM_EXPIRED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
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
return {0, ver}",
    )
});

/// Sets the new value only if the record is live at the expected version:
/// 1 when written, 0 when not, -1 when the header does not decode.
/// ARGV: expected version, now, ttl, the new value (its header already at version + 1).
pub(super) static REPLACE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"
local head = redis.call('GETRANGE', KEYS[1], 0, {last})
if head == '' then return 0 end
local v, e = string.match(head, '^(%d+) (%d+)\n')
if not v then return -1 end
if v ~= ARGV[1] or tonumber(e) <= tonumber(ARGV[2]) then return 0 end
redis.call('SET', KEYS[1], ARGV[4], 'PX', ARGV[3])
return 1",
        last = HEADER_MAX - 1
    ))
});

/// Deletes the record only at the version ARGV[1]; a key that holds no
/// record is left alone.
pub(super) static DELETE_AT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"
local head = redis.pcall('GETRANGE', KEYS[1], 0, {last})
if type(head) ~= 'string' or string.match(head, '^(%d+) ') ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])",
        last = HEADER_MAX - 1
    ))
});

/// Deletes those of KEYS whose record expired at or before ARGV[1], at most ARGV[2].
pub(super) static PURGE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"
local n = 0
for _, k in ipairs(KEYS) do
  if n >= tonumber(ARGV[2]) then break end
  local head = redis.pcall('GETRANGE', k, 0, {last})
  if type(head) == 'string' then
    local e = string.match(head, '^%d+ (%d+)\n')
    if e and tonumber(e) <= tonumber(ARGV[1]) then n = n + redis.call('DEL', k) end
  end
end
return n",
        last = HEADER_MAX - 1
    ))
});

/// `EVALSHA` of `script` on one key; its arguments follow.
pub(super) fn evalsha(script: &Script, key: &[u8]) -> Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash()).arg(1).arg(key);
    cmd
}
