#!/usr/bin/env bash
# Two builds of a criterion bench, run in alternating turns on one machine
# (before, after, before, after, …), then each row's median over the turns
# per build and the ratio after ÷ before, for the rows both builds have.
# On a machine other work loads, one run of each moves with the load;
# alternating turns and medians are what make the two comparable
# (BENCHMARKS.md, "Contract 0.3 and issue 47 before and after").
#
#   scripts/bench-turns.sh TURNS BEFORE_BINARY AFTER_BINARY [CRITERION_ARGS…]
#
# The binaries are bench executables copied aside after
# `cargo bench -p idem --bench NAME --no-run` (it prints their paths);
# CRITERION_ARGS go to both (a row filter, `--measurement-time 2`, …).
# Each run's output is kept in $TURNS_OUT (default: a temporary directory),
# as before-N.txt and after-N.txt.
set -euo pipefail
turns="$1"; before="$(realpath "$2")"; after="$(realpath "$3")"; shift 3
out="${TURNS_OUT:-$(mktemp -d)}"
mkdir -p "$out"
for turn in $(seq 1 "$turns"); do
  for build in before after; do
    bin=$before; [ "$build" = after ] && bin=$after
    echo "turn $turn, $build: $(date -u +%H:%M:%S) UTC, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    # A directory of its own per run: criterion compares a run with the
    # last one it finds under target/criterion, which would mix the builds.
    (cd "$(mktemp -d)" && "$bin" --bench "$@") >"$out/$build-$turn.txt"
  done
done
python3 - "$out" "$turns" <<'PY'
import pathlib, re, statistics, sys
out, turns = pathlib.Path(sys.argv[1]), int(sys.argv[2])
unit = {"ps": 1e-3, "ns": 1.0, "µs": 1e3, "us": 1e3, "ms": 1e6, "s": 1e9}
row = re.compile(r"^(\S+)\s+time:\s+\[\S+ \S+ (\S+) (\S+) \S+ \S+\]", re.M)
def times(text):  # row → the estimate in ns; a long name puts time: on the next line
    return {m[1]: float(m[2]) * unit[m[3]] for m in row.finditer(re.sub(r"\n\s+time:", " time:", text))}
runs = {b: [times((out / f"{b}-{t}.txt").read_text()) for t in range(1, turns + 1)] for b in ("before", "after")}
def show(ns):
    return f"{ns / 1e3:.3f} µs" if ns >= 1e3 else f"{ns:.0f} ns"
print(f"| row | before, median of {turns} | after, median of {turns} | after ÷ before | after ÷ before, each turn |")
print("|---|---:|---:|---:|---|")
for name in runs["before"][0]:
    if all(name in r for r in runs["before"] + runs["after"]):
        b = [r[name] for r in runs["before"]]; a = [r[name] for r in runs["after"]]
        each = " / ".join(f"{y / x:.2f}" for x, y in zip(b, a))
        print(f"| {name} | {show(statistics.median(b))} | {show(statistics.median(a))} | "
              f"{statistics.median(a) / statistics.median(b):.2f} | {each} |")
print(f"(runs kept in {out})", file=sys.stderr)
PY
