//! Builds the guard component (`guest/`, target `wasm32-wasip2`) so that a
//! plain `cargo build` or `cargo test` of the workspace embeds it: no manual
//! wasm step. The guard itself, and, with this crate's feature `testing`
//! (its tests and benchmarks), a deliberately misbehaving one (the guest's
//! feature `misbehave`) that the host's tests use to prove that traps and
//! runaway guests fail closed, and the guard benchmark uses to measure the
//! bare cost of a call into the component.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    // Without the engine (the `gateway` fuzz target's build) nothing embeds the component.
    if env::var_os("CARGO_FEATURE_ENGINE").is_none() {
        return;
    }
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir.parent().unwrap();
    let guest = root.join("guest");
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());

    for path in ["guest/src", "guest/Cargo.toml", "wit", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", root.join(path).display());
    }

    // A target directory of its own: the outer cargo holds the lock on its own.
    // Beside the outer target dir (found from OUT_DIR), so it is kept between builds.
    let target_dir = out_dir
        .ancestors()
        .nth(4)
        .map_or_else(|| out_dir.join("guest-target"), |t| t.join("guest-target"));

    ensure_wasm_target();
    build(
        &guest,
        &target_dir.join("guard"),
        &[],
        &out_dir.join("idem_guard.wasm"),
    );
    if env::var_os("CARGO_FEATURE_TESTING").is_some() {
        build(
            &guest,
            &target_dir.join("misbehaving"),
            &["--features", "misbehave"],
            &out_dir.join("idem_guard_misbehaving.wasm"),
        );
    }
}

/// rustup installs the targets that rust-toolchain.toml lists only when it
/// installs the toolchain itself; a machine that already had this toolchain
/// lacks `wasm32-wasip2`. Add it then, so that a fresh clone builds with a
/// plain `cargo build`.
fn ensure_wasm_target() {
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let sysroot = Command::new(&rustc)
        .args(["--print", "sysroot"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    if let Some(target) = sysroot.map(|s| s.join("lib/rustlib/wasm32-wasip2")) {
        // Cargo replays a build script's warnings on every build until the
        // script runs again: once the target is installed (the directory
        // appears), it runs again and stops saying "installing".
        println!("cargo:rerun-if-changed={}", target.display());
        if target.is_dir() {
            return;
        }
    }
    println!(
        "cargo:warning=installing the wasm32-wasip2 target with rustup (listed in rust-toolchain.toml)"
    );
    // RUSTUP_TOOLCHAIN, set by the rustup proxy, makes this the active toolchain.
    let added = Command::new("rustup")
        .args(["target", "add", "wasm32-wasip2"])
        .status()
        .is_ok_and(|s| s.success());
    if !added {
        println!(
            "cargo:warning=`rustup target add wasm32-wasip2` failed; the guest build will say why"
        );
    }
}

fn build(guest: &Path, target_dir: &Path, extra: &[&str], dest: &Path) {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(guest)
        .args([
            "build",
            "--lib",
            "--target",
            "wasm32-wasip2",
            "--profile",
            "guest",
        ])
        .args(extra)
        .arg("--target-dir")
        .arg(target_dir);
    // What the outer build set for host code must not leak into the guest's.
    for var in [
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTFLAGS",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_BUILD_TARGET",
        "CARGO_TARGET_DIR",
        "CARGO_PROFILE_RELEASE_DEBUG",
        "CARGO_LLVM_COV",
        "LLVM_PROFILE_FILE",
    ] {
        cmd.env_remove(var);
    }
    let status = cmd
        .status()
        .expect("run cargo to build the guard component");
    assert!(
        status.success(),
        "building the guard component failed (is the wasm32-wasip2 target installed? rust-toolchain.toml lists it)"
    );
    let built = target_dir.join("wasm32-wasip2/guest/idem_guest.wasm");
    std::fs::copy(&built, dest).unwrap_or_else(|e| panic!("copy {}: {e}", built.display()));
}
