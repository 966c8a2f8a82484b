//! The Lua scripts, for what no native command does atomically. Their text
//! is part of the on-store layout (`wit/store-layout/`), shared with the
//! JavaScript and Python stores, so every host loads the same scripts.

use super::value::HEADER_MAX;
use redis::{Cmd, Script};
use std::sync::LazyLock;

/// Overwrites an expired record at its version + 1, or returns the live one
/// that a concurrent claimer wrote meanwhile: `{0, version}` or `{1, value}`;
/// `{2}` when the header does not decode.
/// ARGV: now, ttl, expires_at_ms, the value after the header.
pub(super) static CLAIM_EXPIRED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(include_str!(
        "../../../../wit/store-layout/redis/claim_expired.lua"
    ))
});

/// Sets the new value only if the record is live at the expected version:
/// 1 when written, 0 when not, -1 when the header does not decode.
/// ARGV: expected version, now, ttl, the new value (its header already at version + 1).
pub(super) static REPLACE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(include_str!(
        "../../../../wit/store-layout/redis/replace.lua"
    ))
});

/// Deletes the record only if it is live at ARGV[2] and (unless ARGV[1] is
/// empty) at the version ARGV[1]; a key that holds no record is left alone.
pub(super) static DELETE_AT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(include_str!(
        "../../../../wit/store-layout/redis/delete_at.lua"
    ))
});

/// The server's `TIME`, asked on one key so that a cluster answers from
/// the node that holds its slot: `{seconds, microseconds}`.
pub(super) static TIME: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../../wit/store-layout/redis/time.lua")));

/// Deletes those of KEYS whose record expired at or before ARGV[1], at most ARGV[2].
pub(super) static PURGE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../../wit/store-layout/redis/purge.lua")));

/// The scripts read a header with `GETRANGE key 0 41`: the last byte it can use.
const _: () = assert!(HEADER_MAX - 1 == 41);

/// `EVALSHA` of `script` on one key; its arguments follow.
pub(super) fn evalsha(script: &Script, key: &[u8]) -> Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash()).arg(1).arg(key);
    cmd
}
