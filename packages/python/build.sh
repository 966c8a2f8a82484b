#!/usr/bin/env bash
# Builds the idem-guard wheel: writes the guard component into the package
# (src/idem_guard/idem-guard.wasm) and packs it with the Python sources and the
# on-store layout's scripts and SQL (wit/store-layout/, as
# idem_guard/store_layout/). Prints the wheel's path.
#
#   packages/python/build.sh [IDEM_BIN] [OUT_DIR]
#
# The component comes from $IDEM_COMPONENT if set (copied as it is), else from
# `IDEM_BIN component --out` when IDEM_BIN is given, else from
# scripts/build-component.sh: the guest crate alone for wasm32-wasip2, no Rust
# host compiled (the bytes `idem component --out` writes). OUT_DIR defaults to
# $CARGO_TARGET_DIR/wheels (target/wheels).
# The wheel is built offline (pip wheel --no-index --no-build-isolation) with the
# setuptools pinned in build-requirements.txt, installed once into a venv of its
# own under the target directory (that one step needs the package index).
# Needs Python 3.11 (python3.11, or $PYTHON).
set -euo pipefail

package="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$package/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
idem_bin="${1:-}"
out="${2:-$target/wheels}"
wasm="$package/src/idem_guard/idem-guard.wasm"

if [[ -n "${IDEM_COMPONENT:-}" ]]; then
  [[ -f "$IDEM_COMPONENT" ]] || { echo "build.sh: no component at $IDEM_COMPONENT (IDEM_COMPONENT)" >&2; exit 1; }
  [[ "$(realpath "$IDEM_COMPONENT")" == "$(realpath -m "$wasm")" ]] || cp "$IDEM_COMPONENT" "$wasm"
elif [[ -n "$idem_bin" ]]; then
  "$idem_bin" component --out "$wasm"
else
  bash "$root/scripts/build-component.sh" "$wasm" >/dev/null
fi

venv="$target/python-build-venv"
if ! cmp -s "$package/build-requirements.txt" "$venv/build-requirements.txt" 2>/dev/null; then
  rm -rf "$venv"
  "${PYTHON:-python3.11}" -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$package/build-requirements.txt"
  cp "$package/build-requirements.txt" "$venv/build-requirements.txt"
fi

# Built from a copy, so setuptools' build/ and egg-info never land in the source tree.
mkdir -p "$target" "$out"
out="$(cd "$out" && pwd)"
stage="$(mktemp -d "$target/python-build.XXXXXX")"
trap 'rm -rf "$stage"' EXIT
cp -r "$package/pyproject.toml" "$package/README.md" "$package/src" "$stage/"
find "$stage" -name __pycache__ -prune -exec rm -rf {} +
# The on-store layout's scripts and SQL, shared by every host and kept once in
# wit/store-layout/: copied into the wheel, never into the source tree (from a
# checkout, idem_guard.layout reads wit/store-layout/ itself).
layout="$stage/src/idem_guard/store_layout"
rm -rf "$layout"
mkdir -p "$layout"
cp -r "$root/wit/store-layout/README.md" "$root/wit/store-layout/redis" "$root/wit/store-layout/postgres" "$layout/"
"$venv/bin/python" -m pip wheel --quiet --disable-pip-version-check --no-deps --no-index --no-build-isolation \
  --wheel-dir "$out" "$stage"

wheel="$out/idem_guard-0.3.0-py3-none-any.whl"
"$venv/bin/python" - "$wheel" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
assert "idem_guard/idem-guard.wasm" in names, f"{sys.argv[1]} lacks the component: {names}"
for shared in ("redis/replace.lua", "redis/claim_expired.lua", "redis/delete_at.lua", "redis/time.lua", "postgres/schema.sql", "postgres/statements.sql"):
    assert f"idem_guard/store_layout/{shared}" in names, f"{sys.argv[1]} lacks the layout's {shared}: {names}"
PY
echo "$wheel"
