//! The guard component's exact bytes and its WIT contract, as embedded.

/// The guard component (`guest/`, built for `wasm32-wasip2` by this crate's
/// build script). `idem component --out FILE` writes exactly these bytes for
/// other hosts to load.
pub const COMPONENT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/idem_guard.wasm"));

/// The WIT contract, file by file.
pub const WIT: &[(&str, &str)] = &[
    ("types.wit", include_str!("../../wit/types.wit")),
    ("store.wit", include_str!("../../wit/store.wit")),
    ("clock.wit", include_str!("../../wit/clock.wit")),
    ("random.wit", include_str!("../../wit/random.wit")),
    ("guard.wit", include_str!("../../wit/guard.wit")),
    ("world.wit", include_str!("../../wit/world.wit")),
];

/// A deliberately broken guard for tests: `begin` traps on the key
/// `"!trap"`, spins forever on `"!spin"` and allocates without bound on
/// `"!grow"`. On `"!noop"` it answers `conflict` at once, and on `"!clock"`
/// after one `now-ms` import, without the store: the benchmark's measure of
/// the component boundary itself. On `"!replay"` it crosses what a replay
/// crosses (the clock, one `insert` handing back the stored record) and
/// returns the record's response, deciding nothing. Never loaded unless a
/// test or the benchmark asks for it; built only with the feature `testing`.
#[cfg(feature = "testing")]
pub const MISBEHAVING_COMPONENT: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/idem_guard_misbehaving.wasm"));

#[cfg(test)]
mod tests {
    /// `idem wit` prints every file of the contract, none left out.
    #[test]
    fn every_wit_file_is_embedded() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../wit");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "wit"))
            .map(|path| path.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        on_disk.sort();
        let mut embedded: Vec<String> = super::WIT.iter().map(|(n, _)| (*n).to_owned()).collect();
        embedded.sort();
        assert_eq!(embedded, on_disk);
        assert!(
            super::WIT
                .iter()
                .all(|(_, text)| text.contains("idem:guard@0.3.0"))
        );
    }
}
