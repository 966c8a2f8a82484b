//! The Lua scripts, for what no native command does atomically. Their text
//! is part of the on-store layout (`wit/store-layout/`), shared with the
//! JavaScript and Python stores, so every host loads the same scripts.

use super::resp::Command;
use super::value::HEADER_MAX;
use std::sync::LazyLock;

/// A script's text and its SHA-1, by which `EVALSHA` names it.
pub(super) struct Script {
    code: &'static str,
    hash: String,
}

impl Script {
    fn new(code: &'static str) -> Self {
        let hash = redis::Script::new(code).get_hash().to_owned();
        Script { code, hash }
    }

    pub(super) fn hash(&self) -> &str {
        &self.hash
    }

    /// `SCRIPT LOAD` of this script (on a cluster, sent to every primary).
    pub(super) fn load(&self) -> Command {
        let mut cmd = Command::with_capacity("SCRIPT", self.code.len() + 16);
        cmd.arg("LOAD").arg(self.code);
        cmd
    }
}

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

/// `EVALSHA` of `script` on one key, with room for `capacity` bytes of
/// the arguments that follow.
pub(super) fn evalsha(script: &Script, key: &[u8], capacity: usize) -> Command {
    let mut cmd = Command::with_capacity("EVALSHA", script.hash.len() + key.len() + capacity + 32);
    cmd.arg(script.hash()).arg(1u64).arg(key);
    cmd
}
