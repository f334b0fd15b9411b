"""What one verify forward costs as the draft tree grows: time of a forward over W new tokens
on top of an L-token KV cache, relative to W = 1 (plain decoding), on one GPU.

    python -m benchmarks.gpu_verify_cost                          # CUDA, bf16, both shapes
    python -m benchmarks.gpu_verify_cost --device cpu --quick     # smoke test

Speculative decoding pays when accepted tokens per step exceed this ratio: the simulator
(`python -m benchmarks accept`) gives the first, this script the second. Weights are random (the
cost of a forward does not depend on their values), in the shapes of the default model
(SmolLM2-135M) and of an 8B Llama, so no weights travel. Each forward passes explicit
positions and a 4-D additive mask, as the engine does (`lookahead.hf`), through SDPA; the
cache is cropped back to L after each timed forward. CUDA timings: CUDA events around each
forward after warm-up, median and p90 of `--iters`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import time

SHAPES = {
    # SmolLM2-135M-Instruct (the default model).
    "smollm2-135m": dict(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        vocab_size=49152,
        tie_word_embeddings=True,
    ),
    # Llama-3.1-8B.
    "llama-8b": dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        tie_word_embeddings=False,
    ),
    # For --quick.
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1000,
        tie_word_embeddings=True,
    ),
}


def measure(shape: str, widths, ctx: int, iters: int, warmup: int, device: str, dtype):
    """Rows {shape, ctx, W, p50_ms, p90_ms} for one model shape."""
    import torch
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(max_position_embeddings=ctx + max(widths) + 8, **SHAPES[shape])
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(prev)
    ids = torch.randint(0, cfg.vocab_size, (1, ctx + max(widths)), device=device)
    cache = DynamicCache(config=cfg)

    def fwd(x, pos, mask):
        model(
            input_ids=x,
            position_ids=pos,
            attention_mask=mask,
            past_key_values=cache,
            use_cache=True,
        )
        cache.crop(-x.shape[1])  # this transformers takes the number of tokens to drop

    rows = []
    with torch.inference_mode():
        model(input_ids=ids[:, :ctx], past_key_values=cache, use_cache=True)
        for W in widths:
            pos = torch.arange(ctx, ctx + W, device=device)[None]
            keep = torch.ones(W, ctx + W, dtype=torch.bool, device=device)
            keep[:, ctx:] = torch.tril(torch.ones(W, W, dtype=torch.bool, device=device))
            mask = torch.zeros((1, 1, W, ctx + W), dtype=dtype, device=device)
            mask.masked_fill_(~keep, torch.finfo(dtype).min)
            x = ids[:, ctx : ctx + W]

            for _ in range(warmup):
                fwd(x, pos, mask)
            assert cache.get_seq_length() == ctx, "the cache was not cropped back"
            times = []
            for _ in range(iters):
                if device == "cuda":
                    a = torch.cuda.Event(enable_timing=True)
                    b = torch.cuda.Event(enable_timing=True)
                    a.record()
                    fwd(x, pos, mask)
                    b.record()
                    b.synchronize()
                    times.append(a.elapsed_time(b))
                else:
                    t0 = time.perf_counter()
                    fwd(x, pos, mask)
                    times.append((time.perf_counter() - t0) * 1e3)
            times.sort()
            rows.append(
                {
                    "shape": shape,
                    "ctx": ctx,
                    "W": W,
                    "p50_ms": statistics.median(times),
                    "p90_ms": times[int(0.9 * (len(times) - 1))],
                }
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--quick", action="store_true", help="tiny shape, few iterations")
    ap.add_argument("--shapes", default="smollm2-135m,llama-8b")
    ap.add_argument("--widths", default="1,2,4,8,16,32,64", help="tokens per forward (W)")
    ap.add_argument("--ctx", type=int, default=1024, help="tokens already in the KV cache")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument("--out", default="benchmarks/out/gpu_verify_cost.json")
    args = ap.parse_args(argv)

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device; use --device cpu for the smoke test")
    shapes = ["tiny"] if args.quick else [s for s in args.shapes.split(",") if s]
    bad = [s for s in shapes if s not in SHAPES]
    if bad:
        raise SystemExit(f"unknown shapes {bad}; choose from {sorted(SHAPES)}")
    widths = [int(w) for w in args.widths.split(",")]
    iters, warmup = (3, 1) if args.quick else (args.iters, args.warmup)
    dtype = getattr(torch, args.dtype)
    rows = []
    for shape in shapes:
        rows += measure(shape, widths, args.ctx, iters, warmup, args.device, dtype)
        if args.device == "cuda":
            torch.cuda.empty_cache()

    print(f"\nverify forward cost, {args.dtype}, KV cache {args.ctx} tokens, batch 1")
    print(f"{'shape':<14}{'W':>4}{'p50 ms':>10}{'p90 ms':>10}{'x W=1':>8}")
    for r in rows:
        base = next(x["p50_ms"] for x in rows if x["shape"] == r["shape"] and x["W"] == widths[0])
        r["ratio"] = r["p50_ms"] / base
        print(
            f"{r['shape']:<14}{r['W']:>4}{r['p50_ms']:>10.3f}{r['p90_ms']:>10.3f}{r['ratio']:>8.2f}"
        )
    import pathlib

    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name() if args.device == "cuda" else platform.processor(),
        "torch": torch.__version__,
        "argv": sys.argv,
    }
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
