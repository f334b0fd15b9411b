"""The llama.cpp engine on the default model's Q4_1 GGUF: what a verify forward costs here,
whether outputs equal llama.cpp's plain greedy decoding, and how fast it is.

    python -m research.llamacpp_probe [MAX_NEW_TOKENS]

The demo's 8 prompts (rag and summarization, chat template), 2 threads. Prints the cost of
a forward of W rows (logits for every row, as a verify needs, and for the last only, as
llama-bench's prompt processing), then per prompt: plain tok/s; lookahead with a fixed
4-node tree and with the cost-aware sizer: tok/s, tokens per step, and where the output
first differs from plain decoding, with plain's top-1 / top-2 logit margin there (a
near-tie: the quantized kernels give a row of a W-row forward other rounding than one row).
Also a root-only run (budget 0) through the same engine: equal to plain when the KV
bookkeeping is exact.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from benchmarks.harness import run_script


def cost_curve(m, rng, all_rows: bool) -> dict:
    m.reset()
    m.prefill(rng.integers(0, m.n_vocab, 128).tolist(), [0])
    out = {}
    for w in (1, 2, 3, 4, 8, 16, 32):
        ts = []
        for _ in range(8):
            want = [True] * w if all_rows else [False] * (w - 1) + [True]
            t0 = time.perf_counter()
            m.decode(rng.integers(0, m.n_vocab, w).tolist(), range(128, 128 + w), [[0]] * w, want)
            ts.append(time.perf_counter() - t0)
            m.seq_rm(-1, 128, -1)
        out[w] = float(np.median(ts[2:])) * 1e3
    m.reset()
    return out


def plain_with_margins(m, ids, n):
    """llama.cpp greedy decoding, and plain's top-1 minus top-2 logit at each output token."""
    m.reset()
    row = m.prefill(list(ids), [0])
    out, margins, pos = [], [], len(ids)
    while True:
        top = np.partition(row, -2)[-2:]
        out.append(int(np.argmax(row)))
        margins.append(float(top[1] - top[0]))
        if len(out) >= n or m.is_eog(out[-1]):
            return out, margins
        row = m.decode([out[-1]], [pos], [[0]], [True])[0]
        pos += 1


def main(argv: list[str]) -> int:
    from lookahead.demo import chat_ids, load_prompts
    from lookahead.llamacpp import LlamaCppGenerator, LlamaCppModel
    from lookahead.llamacpp.costs import measure_costs
    from lookahead.models import default_gguf_path, default_model_path
    from lookahead.sizing import CostAwareSizer, FixedSizer
    from transformers import AutoTokenizer

    n = int(argv[0]) if argv else 256
    tok = AutoTokenizer.from_pretrained(str(default_model_path()))
    prompts = load_prompts(None)
    gguf = default_gguf_path()
    # flash attention as llama.cpp's default gave it when this was measured (before 5bf55b5)
    plain = LlamaCppModel(gguf, n_ctx=4096, n_threads=2, n_seq_max=1, flash_attn="auto")
    m = LlamaCppModel(gguf, n_ctx=4096, n_threads=2, flash_attn="auto")
    rng = np.random.default_rng(0)
    for all_rows in (True, False):
        c = cost_curve(plain, rng, all_rows)
        print(f"forward of W rows after 128 tokens, logits for {'every row' if all_rows else 'the last row'}: "
              + ", ".join(f"W={w} {v:.1f} ms ({v / c[1]:.2f}x)" for w, v in c.items()))  # fmt: skip
    gens = {
        "root only": LlamaCppGenerator(m, sizer=FixedSizer(0)),
        "fixed 4": LlamaCppGenerator(m, sizer=FixedSizer(4)),
        "cost-aware": LlamaCppGenerator(m, sizer=CostAwareSizer(costs=measure_costs(m))),
    }
    speed = {k: [] for k in ["plain", *gens]}
    for p in prompts:
        ids = chat_ids(tok, p["turns"][0])
        t0 = time.perf_counter()
        want, margins = plain_with_margins(plain, ids, n)
        speed["plain"].append(len(want) / (time.perf_counter() - t0))
        line = [f"{p['category']:<13} {len(ids):>4} tokens: plain {speed['plain'][-1]:.1f} tok/s"]
        for k, g in gens.items():
            t0 = time.perf_counter()
            res = g.generate(ids, n)
            speed[k].append(len(res.ids) / (time.perf_counter() - t0))
            j = next((i for i, (a, b) in enumerate(zip(res.ids, want)) if a != b), None)
            fork = "equal" if j is None else f"fork at {j} (plain margin {margins[j]:.3f})"
            line.append(f"{k} {speed[k][-1]:.1f} tok/s {res.stats.tokens_per_step:.2f}/step {fork}")
        print(" | ".join(line), flush=True)
    for k, v in speed.items():
        ratio = [a / b for a, b in zip(v, speed["plain"])]
        print(
            f"{k:<10} median {statistics.median(v):.1f} tok/s, median speed-up {statistics.median(ratio):.3f}"
        )
    return 0


if __name__ == "__main__":
    run_script(main, __doc__)
