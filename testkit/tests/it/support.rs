//! What the tests share: the `idem-testkit` binary, unique keys, and the
//! network stores' URLs.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Cargo builds the package's binary for its tests and names it here.
pub const TESTKIT: &str = env!("CARGO_BIN_EXE_idem-testkit");

/// A key no other test, process or run uses.
pub fn unique(name: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{name}-{}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        fastrand::u64(..)
    )
}

/// The URL in `var`, or `None` (the test then passes without a server,
/// saying so, as the host's network-store tests do).
pub fn server_url(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            eprintln!(
                "skipped: {var} is not set (CI sets it; e.g. {var}=redis://127.0.0.1:6379 or postgres://postgres@127.0.0.1:5432/test)"
            );
            None
        }
    }
}
