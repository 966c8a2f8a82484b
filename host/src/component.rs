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
    ("guard.wit", include_str!("../../wit/guard.wit")),
    ("world.wit", include_str!("../../wit/world.wit")),
];

/// A deliberately broken guard for tests: `begin` traps on the key
/// `"!trap"`, spins forever on `"!spin"` and allocates without bound on
/// `"!grow"`. On `"!noop"` it answers `conflict` at once, and on `"!clock"`
/// after one `now-ms` import, without the store: the benchmark's measure of
/// the component boundary itself. Never loaded unless a test or the
/// benchmark asks for it.
#[doc(hidden)]
pub const MISBEHAVING_COMPONENT: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/idem_guard_misbehaving.wasm"));
