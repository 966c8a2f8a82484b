//! The gateways' wall clocks, skewed and stepped with libfaketime while
//! they run: only `CLOCK_REALTIME` moves (as an NTP step, a VM resumed or a
//! mis-set host moves it); their monotonic and boot clocks stay real. The
//! guard judges time by the store's clock (`wit/clock.wit`), so none of it
//! may change what runs: the soak's checks hold whatever the wall clocks say.

use anyhow::bail;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// Debian's libfaketime (package `faketime`).
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// One gateway's wall clock: an offset from the real one, in seconds, kept
/// in a file that libfaketime reads on every clock call, so a step reaches
/// the running process at once (and a restarted one starts with it).
pub(super) struct WallClock {
    file: PathBuf,
    offset_s: Mutex<i64>,
}

impl WallClock {
    /// A clock `offset_s` ahead of the real one (behind if negative), its
    /// file in `dir`. Fails, naming the package, without libfaketime.
    pub(super) fn new(dir: &Path, name: &str, offset_s: i64) -> anyhow::Result<WallClock> {
        if !Path::new(LIBFAKETIME).exists() {
            bail!(
                "{LIBFAKETIME} is missing: --skew and --clock-steps need libfaketime (apt-get install faketime), or pass --skew 0s --clock-steps 0"
            );
        }
        let clock = WallClock {
            file: dir.join(format!("wall-clock-{name}")),
            offset_s: Mutex::new(offset_s),
        };
        clock.write(offset_s)?;
        Ok(clock)
    }

    /// Moves the clock by `by_s` seconds; returns the new offset.
    pub(super) fn step(&self, by_s: i64) -> anyhow::Result<i64> {
        let mut offset = super::lock(&self.offset_s);
        *offset += by_s;
        self.write(*offset)?;
        Ok(*offset)
    }

    fn write(&self, offset_s: i64) -> anyhow::Result<()> {
        std::fs::write(&self.file, format!("{offset_s:+}\n"))?;
        Ok(())
    }

    /// Runs `command` on this clock.
    pub(super) fn apply(&self, command: &mut Command) {
        command
            .env("LD_PRELOAD", LIBFAKETIME)
            .env("FAKETIME_TIMESTAMP_FILE", &self.file)
            .env("FAKETIME_NO_CACHE", "1")
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
    }
}
