#!/usr/bin/env bash
# Runs every fuzz target (fuzz/fuzz_targets/) for SECONDS each (default 20)
# with cargo-fuzz on the nightly toolchain. Each target checks the guard's
# invariants, not only that it does not panic (guest/src/fuzzing.rs).
#
# Needs: rustup toolchain nightly; `cargo install cargo-fuzz --locked`.
# Corpora grow under fuzz/corpus/<target> (not committed). A crash lands in
# fuzz/artifacts/<target>/; copy it to fuzz/regressions/<target>/ and
# `cargo test -p idem-guest` replays it from then on.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds="${1:-20}"
# A shared CARGO_TARGET_DIR would mix sanitizer builds with normal ones.
unset CARGO_TARGET_DIR

failed=()
for target in $(cargo +nightly fuzz list); do
  mkdir -p "corpus/$target"
  echo "== $target: ${seconds}s"
  rc=0
  cargo +nightly fuzz run -O "$target" "corpus/$target" "regressions/$target" -- \
    -max_total_time="$seconds" -print_final_stats=1 >"corpus/$target.log" 2>&1 || rc=$?
  grep -E '^(stat::number_of_executed_units|stat::average_exec_per_sec|stat::peak_rss_mb)|ERROR|panicked|SUMMARY' "corpus/$target.log" || true
  if [ "$rc" -ne 0 ]; then
    failed+=("$target")
  fi
done

if [ "${#failed[@]}" -ne 0 ]; then
  echo "fuzzing found failures in: ${failed[*]} (inputs under fuzz/artifacts/)" >&2
  exit 1
fi
echo "fuzzing: no failures"
