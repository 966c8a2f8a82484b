//! Checks for the fuzz targets (`fuzz/`) and for their regression test: each
//! takes arbitrary bytes, decodes them into inputs, runs the guard's logic
//! and panics when an invariant breaks — not only when the code panics.
//!
//! Shared here so that a crash the fuzzer finds, saved under
//! `fuzz/regressions/<target>/`, replays through the very same check in
//! `cargo test -p idem-guest`.

mod decide;
mod fingerprint;
mod guard;
mod input;
mod limits;
pub(crate) mod store;

pub use decide::check_decide;
pub use fingerprint::check_fingerprint_canonical;
pub use guard::check_guard;
pub use limits::check_limits;

/// One fuzz target's check.
pub type Check = fn(&[u8]);

/// The fuzz targets, by name.
pub const TARGETS: &[(&str, Check)] = &[
    ("decide", check_decide),
    ("guard", check_guard),
    ("limits", check_limits),
    ("fingerprint", check_fingerprint_canonical),
];

#[cfg(test)]
mod tests {
    use super::*;

    /// Every file saved under `fuzz/regressions/<target>/` replays through its check.
    #[test]
    fn fuzz_regressions_replay() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/regressions");
        let mut replayed = 0;
        for (name, check) in TARGETS {
            let dir = root.join(name);
            let Ok(files) = std::fs::read_dir(&dir) else {
                continue;
            };
            for file in files {
                let path = file.unwrap().path();
                let bytes = std::fs::read(&path).unwrap();
                let outcome = std::panic::catch_unwind(|| check(&bytes));
                assert!(outcome.is_ok(), "regression {} fails", path.display());
                replayed += 1;
            }
        }
        assert!(
            replayed >= TARGETS.len(),
            "expected at least one regression input per target under {}",
            root.display()
        );
    }
}
