#!/usr/bin/env bash
# Runs every fuzz target (fuzz/fuzz_targets/) for SECONDS each (default 20)
# with cargo-fuzz. Each target checks invariants, not only that nothing
# panics: the guard's (guest/src/fuzzing.rs) and the gateway's parsing
# (host/src/fuzzing.rs).
#
# Needs cargo-fuzz (`cargo install cargo-fuzz --locked`). cargo-fuzz passes
# -Z flags to rustc: with a nightly toolchain installed it uses that, else
# the repository's pinned stable toolchain with RUSTC_BOOTSTRAP=1.
#
# Corpora grow under fuzz/corpus/<target> (not committed). A failing input
# lands in fuzz/artifacts/<target>/; copy it to fuzz/regressions/<target>/
# and `cargo test` replays it from then on (`cargo test -p idem-guest` for
# the guard's targets, `cargo test -p idem` for `gateway`).
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds="${1:-20}"
# A shared CARGO_TARGET_DIR would mix sanitizer builds with normal ones.
unset CARGO_TARGET_DIR

if ! command -v cargo-fuzz >/dev/null; then
  echo "fuzzing needs cargo-fuzz: cargo install cargo-fuzz --locked" >&2
  exit 1
fi
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  fuzz=(cargo +nightly fuzz)
  echo "fuzzing with $(rustc +nightly --version)"
else
  export RUSTC_BOOTSTRAP=1
  fuzz=(cargo fuzz)
  echo "fuzzing with $(rustc --version) and RUSTC_BOOTSTRAP=1"
fi

# One build for every target; each run below reuses it.
started=$SECONDS
"${fuzz[@]}" build -O
echo "built in $((SECONDS - started))s"

targets=($("${fuzz[@]}" list))
failed=()
for target in "${targets[@]}"; do
  mkdir -p "corpus/$target"
  echo "== $target: ${seconds}s"
  rc=0
  "${fuzz[@]}" run -O "$target" "corpus/$target" "regressions/$target" -- \
    -max_total_time="$seconds" -timeout=10 -print_final_stats=1 >"corpus/$target.log" 2>&1 || rc=$?
  grep -E '^(stat::number_of_executed_units|stat::average_exec_per_sec|stat::peak_rss_mb)|ERROR|panicked|SUMMARY' "corpus/$target.log" || true
  if [ "$rc" -ne 0 ]; then
    tail -40 "corpus/$target.log" >&2
    failed+=("$target")
  fi
done

echo "fuzzing took $((SECONDS - started))s, build included"
echo "fuzz: $((${#targets[@]} - ${#failed[@]})) passed, ${#failed[@]} failed"
if [ "${#failed[@]}" -ne 0 ]; then
  echo "fuzzing found failures in: ${failed[*]} (inputs under fuzz/artifacts/)" >&2
  exit 1
fi
