#!/usr/bin/env bash
# The wheel smoke test: each given wheel (or, with --sdist, the wheel pip builds from each
# given sdist) is installed into one fresh venv with no Rust toolchain on PATH, with the
# pinned HF requirements, and tests/wheel/smoke.py runs from outside the checkout.
# Usage: tests/wheel/run.sh dist/lookahead_spec-*.whl [--sdist dist/lookahead_spec-*.tar.gz]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
py=${PY:-python3}
wheels=() sdists=()
while [ $# -gt 0 ]; do
    case $1 in
        --sdist) sdists+=("$(realpath "$2")"); shift 2 ;;
        *) wheels+=("$(realpath "$1")"); shift ;;
    esac
done
[ ${#wheels[@]} -gt 0 ] || { echo "usage: $0 WHEEL [--sdist SDIST]" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$py" -m venv "$work/venv"
# The user's machine: this venv first, and no cargo / rustc anywhere on PATH.
no_rust=$(printf '%s' "$PATH" | tr ':' '\n' | grep -v -e '\.cargo' -e 'rustup' | paste -sd: -)
export PATH="$work/venv/bin:$no_rust" PIP_DISABLE_PIP_VERSION_CHECK=1
# Cost curves measured for the smoke test's tiny model stay in the scratch folder.
export LOOKAHEAD_COST_DIR="$work/costs"
if command -v cargo >/dev/null || command -v rustc >/dev/null; then
    echo "wheel smoke: a Rust toolchain is still on PATH: $(command -v cargo rustc)" >&2
    exit 1
fi
pip install -q -r "$root/requirements/hf.txt"
cd "$work"
for whl in "${wheels[@]}"; do
    echo "== $(basename "$whl")"
    pip install -q --no-deps --force-reinstall "$whl"
    pip check
    python "$root/tests/wheel/smoke.py"
done
for sdist in "${sdists[@]}"; do
    echo "== wheel built from $(basename "$sdist")"
    # Building from source needs Rust: put the toolchain back for the build only.
    PATH="$PATH:$HOME/.cargo/bin" pip wheel -q --no-deps -w "$work/from-sdist" "$sdist"
    pip install -q --no-deps --force-reinstall "$work"/from-sdist/lookahead_spec-*.whl
    python "$root/tests/wheel/smoke.py"
done
