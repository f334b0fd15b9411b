"""Time the tree kernels: Triton vs the torch reference (and SGLang's per-request loop for
the full mask), on one GPU in one call.

    python -m benchmarks.gpu_kernels                      # CUDA, full grid, ~2-4 minutes
    python -m benchmarks.gpu_kernels --device cpu --quick # smoke test: refs + Triton interpreter
    python -m benchmarks.gpu_kernels --device cpu         # the torch references on CPU

Grid: B in {1, 8, 32, 64}, W in {8, 16, 32}, V = 151936 (Qwen2 vocabulary) for sampling,
`--seq-len` tokens already in the KV cache for the full mask. CUDA timings use CUDA events
around every launch after warm-up and report the median (p50) and p90 over `--iters`
launches; CPU timings use perf_counter the same way. Every Triton result is compared with
the reference before it is timed. Rows go to a JSON file (`--out`) and a table on stdout.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from typing import Callable

import numpy as np


def sglang_full_mask_loop(tree_mask_np: np.ndarray, seq_lens: list[int], device: str):
    """SGLang's NGRAM full-mask construction (NGRAMWorker._prepare_for_speculative_decoding,
    USE_FULL_MASK): one host-built block per request, copied and concatenated.

    `tree_mask_np` is the [B, W, W] tree mask as SGLang holds it (numpy, on the host, from
    its n-gram cache); `seq_lens[b]` is the number of tokens in the KV cache (SGLang's
    `len(origin_input_ids) + len(output_ids) - 1`). Unpadded trees only, as in SGLang.
    """
    import torch

    W = tree_mask_np.shape[1]
    blocks = []
    for i, seq_len in enumerate(seq_lens):
        # As in SGLang: float32 ones allocated on the host, then copied (`.cuda()`).
        req_mask = torch.ones((W, seq_len)).to(device)
        req_mask = torch.cat((req_mask, torch.from_numpy(tree_mask_np[i]).to(device)), dim=1)
        blocks.append(req_mask.to(torch.bool).flatten())
    return torch.cat(blocks, dim=0)


def _random_batch(torch, B: int, W: int, device: str, seed: int):
    """Full trees (num_nodes = W) of mixed shape: each node's parent is one of the previous
    four nodes, giving depths around W / 3; targets follow a child 70% of the time."""
    g = torch.Generator().manual_seed(seed)
    parents = torch.full((B, W), -1, dtype=torch.int32)
    for i in range(1, W):
        lo = max(0, i - 4)
        parents[:, i] = torch.randint(lo, i, (B,), generator=g, dtype=torch.int32)
    tokens = torch.randint(0, 50, (B, W), generator=g, dtype=torch.int32)
    tokens[:, 0] = 0
    target = torch.randint(0, 50, (B, W), generator=g, dtype=torch.int64)
    follow = torch.rand(B, W, generator=g) < 0.7
    for b in range(B):
        for i in range(W - 1, 0, -1):  # the last-listed child wins; any child will do
            p = int(parents[b, i])
            if follow[b, p]:
                target[b, p] = int(tokens[b, i])
    num_nodes = torch.full((B,), W, dtype=torch.int32)
    uniforms = torch.rand(B, W, generator=g)
    to = {"device": device}
    return (
        tokens.to(**to),
        parents.to(**to),
        num_nodes.to(**to),
        target.to(**to),
        uniforms.to(**to),
    )


def _timer(torch, device: str, warmup: int, iters: int) -> Callable:
    def run(fn: Callable[[], object]) -> tuple[float, float]:
        for _ in range(warmup):
            fn()
        times = []
        if device == "cuda":
            torch.cuda.synchronize()
            events = [
                (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                for _ in range(iters)
            ]
            for start, end in events:
                start.record()
                fn()
                end.record()
            torch.cuda.synchronize()
            times = [s.elapsed_time(e) * 1e3 for s, e in events]  # ms -> us
        else:
            for _ in range(iters):
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e6)
        times.sort()
        return statistics.median(times), times[min(len(times) - 1, int(0.9 * len(times)))]

    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--quick", action="store_true", help="tiny grid (smoke test)")
    ap.add_argument("--iters", type=int, default=None, help="timed launches per case")
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--seq-len", type=int, default=None, help="KV tokens per request")
    ap.add_argument("--vocab", type=int, default=None)
    default_out = os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "out", "gpu_kernels.json"
    )
    ap.add_argument("--out", default=default_out, help="JSON rows (default: %(default)s)")
    args = ap.parse_args(argv)

    use_triton = args.device == "cuda" or args.quick
    if args.device == "cpu" and args.quick:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel is compiled
    import lookahead.kernels as K
    import torch
    from lookahead.kernels import _checks

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device; use --device cpu", file=sys.stderr)
        return 2
    dev = args.device
    if args.quick:
        batches, widths = [1, 3], [8, 5]
        V, seq_len, iters, warmup = args.vocab or 1000, args.seq_len or 50, 3, 1
    else:
        batches, widths = [1, 8, 32, 64], [8, 16, 32]
        V, seq_len = args.vocab or 151936, args.seq_len or 1024
        iters, warmup = (200, 20) if dev == "cuda" else (20, 3)
        if dev == "cpu":
            batches = [1, 8]  # the HF engine's CPU path runs small batches
    iters, warmup = args.iters or iters, args.warmup or warmup
    timeit = _timer(torch, dev, warmup, iters)
    triton_name = "triton" if dev == "cuda" else "triton-interpret"

    machine = torch.cuda.get_device_name() if dev == "cuda" else platform.processor() or "cpu"
    versions = {"torch": torch.__version__, "python": platform.python_version()}
    if use_triton:
        import triton

        versions["triton"] = triton.__version__
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    rows: list[dict] = []

    def record(what, provider, B, W, p50, p90, **extra):
        rows.append(
            dict(what=what, provider=provider, B=B, W=W, p50_us=round(p50, 2),
                 p90_us=round(p90, 2), unit="us", device=dev, machine=machine,
                 versions=versions, date=date, **extra)
        )  # fmt: skip

    def same(a, b, what):
        pairs = zip(a, b) if isinstance(a, tuple) else [(a, b)]
        if not all(torch.equal(x, y) for x, y in pairs):
            raise AssertionError(f"{what}: Triton result differs from the reference")

    def bench_case(B: int, W: int) -> None:
        tokens, parents, num_nodes, target, uniforms = _random_batch(torch, B, W, dev, 7)
        seq_lens = torch.full((B,), seq_len, dtype=torch.int64, device=dev)
        seq_sum = seq_len * B
        ops = {
            "tree_metadata": (
                lambda: K.tree_metadata_ref(parents, num_nodes, seq_lens),
                lambda: K.tree_metadata_triton(parents, num_nodes, seq_lens),
                {},
            ),
            "full_mask": (
                lambda: K.build_full_mask_ref(parents, num_nodes, seq_lens, seq_sum),
                lambda: K.build_full_mask_triton(parents, num_nodes, seq_lens, seq_sum),
                {"seq_len": seq_len},
            ),
            "verify_greedy": (
                lambda: K.verify_greedy_ref(tokens, parents, num_nodes, target),
                lambda: K.verify_greedy_triton(tokens, parents, num_nodes, target),
                {},
            ),
        }
        for what, (ref_fn, tri_fn, extra) in ops.items():
            ref_out = ref_fn()
            record(what, "torch-ref", B, W, *timeit(ref_fn), **extra)
            if use_triton:
                same(ref_out, tri_fn(), what)
                record(what, triton_name, B, W, *timeit(tri_fn), **extra)

        tree_np = K.tree_metadata_ref(parents, num_nodes, seq_lens).mask.cpu().numpy()
        lens_host = [seq_len] * B

        def loop():
            return sglang_full_mask_loop(tree_np, lens_host, dev)

        assert torch.equal(loop(), K.build_full_mask_ref(parents, num_nodes, seq_lens))
        record("full_mask", "sglang-loop", B, W, *timeit(loop), seq_len=seq_len)

        gen = torch.Generator(device=dev).manual_seed(B * 1000 + W)
        probs = torch.softmax(torch.randn(B, W, V, generator=gen, device=dev) * 3.0, dim=-1)

        def ref_fn():
            return K.verify_sampling_ref(tokens, parents, num_nodes, probs, uniforms)

        def tri_fn():
            return K.verify_sampling_triton(tokens, parents, num_nodes, probs, uniforms)

        def check():
            _checks.check_probs(probs, uniforms, parents, num_nodes, validate=True)

        ref_out = ref_fn()
        record("verify_sampling", "torch-ref", B, W, *timeit(ref_fn), V=V)
        if use_triton:
            # Float sums in another order can move a draw across a CDF step only when
            # u * total lands within rounding of a step: count such requests, do not fail.
            mism = int((tri_fn().bonus != ref_out.bonus).sum())
            record("verify_sampling", triton_name, B, W, *timeit(tri_fn), V=V,
                   mismatched_requests=mism)  # fmt: skip
        record("check_probs(validate=True)", "torch", B, W, *timeit(check), V=V)

    for W in widths:
        for B in batches:
            bench_case(B, W)
            print(f"done B={B} W={W}", file=sys.stderr, flush=True)

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
    _print_table(rows)
    print(f"\n{len(rows)} rows -> {args.out}")
    return 0


def _print_table(rows: list[dict]) -> None:
    header = f"{'what':28} {'provider':17} {'B':>3} {'W':>3} {'p50 us':>10} {'p90 us':>10}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['what']:28} {r['provider']:17} {r['B']:>3} {r['W']:>3} "
            f"{r['p50_us']:>10.1f} {r['p90_us']:>10.1f}"
        )


if __name__ == "__main__":
    sys.exit(main())
