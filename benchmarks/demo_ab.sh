#!/usr/bin/env bash
# Same-machine A/B of an older engine and this checkout's, on the demo (fp32, 2 threads),
# interleaved: each round runs the old engine at its CPU default (8/16/0.85), this engine at
# that fixed policy, and this engine with its default cost-aware sizer; round 1 starts from
# an empty cost folder (the sizer's first run measures), later rounds find it warm.
#   bash benchmarks/demo_ab.sh [OLD_COMMIT (default 55df403, the 2026-11-30 engine)] [ROUNDS]
# Needs `make dev` (python3 with torch and this checkout installed). Writes OUT (default
# benchmarks/out/demo_ab): {old,fixed,sizer}_r{N}.{txt,json}. DEMO_ARGS are added to every
# demo (a quick check: DEMO_ARGS="--count 1 --max-new-tokens 16" ... 1).
set -euo pipefail
cd "$(dirname "$0")/.."
OLD=${1:-55df403}
ROUNDS=${2:-2}
OUT=${OUT:-benchmarks/out/demo_ab}
PY=${PY:-python3}
read -r -a EXTRA <<< "${DEMO_ARGS:-}"
WORK=$(mktemp -d)
trap 'git worktree remove --force "$WORK/old" 2>/dev/null || true; rm -rf "$WORK"' EXIT
git worktree add -q "$WORK/old" "$OLD"
(cd "$WORK/old" && "$PY" -m maturin build --release --out "$WORK/dist" > "$WORK/build.log" 2>&1)
"$PY" -m venv --system-site-packages "$WORK/venv"  # torch and transformers from PY's site
"$WORK/venv/bin/pip" install -q --no-deps "$WORK"/dist/lookahead_spec-*.whl
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export LOOKAHEAD_COST_DIR="$WORK/costs"
run() { (cd "$WORK" && "$@"); }  # from outside the checkout, so the old venv imports its own
for r in $(seq 1 "$ROUNDS"); do
  run "$WORK/venv/bin/python" -m lookahead.cli demo --dtype float32 --threads 2 "${EXTRA[@]}" \
    --json "$OUT/old_r$r.json" > "$OUT/old_r$r.txt" 2>&1
  run "$PY" -m lookahead.cli demo --dtype float32 --threads 2 --budget 8 --max-budget 16 \
    --min-draft-score 0.85 "${EXTRA[@]}" --json "$OUT/fixed_r$r.json" > "$OUT/fixed_r$r.txt" 2>&1
  run "$PY" -m lookahead.cli demo --dtype float32 --threads 2 "${EXTRA[@]}" \
    --json "$OUT/sizer_r$r.json" > "$OUT/sizer_r$r.txt" 2>&1
done
grep -H "^overall" "$OUT"/*_r*.txt || true
