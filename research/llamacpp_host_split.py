"""Where the llama.cpp engine's host time goes between forwards, per step.

    python -m research.llamacpp_host_split [--quant q4_1] [--categories mt_bench,qa,math_reasoning]

Wraps the calls of one decoding step (the cache's step: extend and draft in one call, and its
extend after the last step; the sizer's cut and
observe and their parts, the tree batch, the KV bookkeeping, stop checks, `model.decode` and
the `llama_decode` inside it) in a timer and prints each one's microseconds per step over
Spec-Bench prompts of the given categories (3 each; greedy, 128 new tokens, flash attention
on). The timer costs well under a microsecond a call. Right after a forward the CPU's caches
hold the model's weights, so each call here costs several times what it does in a loop of its
own: this is the cost a step pays. `model.decode` less `llama_decode` is the Python side of a
forward (the batch filled, the logits' array); its prompt chunks count in too. Last, how many
of each draft's nodes the sizer's cut kept, as shares of its cuts.
"""

from __future__ import annotations

import argparse
import collections
import time

from benchmarks.llamacpp import gguf_of
from benchmarks.traces import DEFAULT_QUESTIONS, select_questions


def prepared(quant: str, categories: str, threads: int = 2) -> tuple:
    """(model, generator, prompt ids): the default model's GGUF in `quant` (flash attention
    on), 3 Spec-Bench prompts of each of `categories` (comma-separated) in its chat template,
    and a generator warmed up on the first, with a fresh history (the warm-up's output drafts
    nothing)."""
    from lookahead.cache import LookaheadCache
    from lookahead.llamacpp import LlamaCppGenerator, LlamaCppModel

    cats = categories.split(",")
    qs = select_questions(str(DEFAULT_QUESTIONS), 3, categories=cats)
    m = LlamaCppModel(gguf_of(quant), 4096, threads, flash_attn="on")
    gen = LlamaCppGenerator(m)
    ids = [m.encode(q["turns"][0], chat=True) for q in qs]
    gen.generate(ids[0], 8)
    gen.cache = LookaheadCache()
    return m, gen, ids


def timer(seconds: dict, calls: collections.Counter):
    """`wrap(obj, name, label)`: puts a timed version of `obj.name` in its place, which adds
    each call's seconds to `seconds[label]` and counts it in `calls[label]`."""

    def wrap(obj, name: str, label: str) -> None:
        f = getattr(obj, name)

        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                seconds[label] += time.perf_counter() - t
                calls[label] += 1

        setattr(obj, name, timed)

    return wrap


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m research.llamacpp_host_split")
    p.add_argument("--quant", default="q4_1")
    p.add_argument("--categories", default="mt_bench,qa,math_reasoning")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    import lookahead.llamacpp.generator as G

    m, gen, ids = prepared(args.quant, args.categories, args.threads)
    seconds: dict = collections.defaultdict(float)
    calls: collections.Counter = collections.Counter()
    wrap = timer(seconds, calls)
    kept: collections.Counter = collections.Counter()  # nodes the sizer's cut kept, per step
    cut = gen.sizer.cut

    def counted(*a, **k):
        n = cut(*a, **k)
        kept[n] += 1
        return n

    gen.sizer.cut = counted
    for name in ("step", "draft", "extend"):
        wrap(gen.cache, name, f"cache.{name}")
    for name in ("cut", "observe"):
        wrap(gen.sizer, name, f"sizer.{name}")
    wrap(gen.sizer.calibration[False], "choose", "  calibration.choose")
    wrap(gen.sizer.calibration[False], "learn", "  calibration.learn")
    wrap(gen.sizer.learned, "curve", "  learned.curve")
    wrap(gen.sizer.learned, "observe", "  learned.observe")
    wrap(m, "decode", "model.decode")
    wrap(m.ll, "llama_decode", "  llama_decode")
    for name in ("propose", "find_cut", "tree_batch", "_fit_branches", "Step"):
        wrap(G, name, name)
    wrap(G.SequenceBook, "ready", "book.ready")
    wrap(G.SequenceBook, "keep", "book.keep")
    steps = 0
    for x in ids:
        steps += gen.generate(x, 128).stats.steps
    print(f"# {args.quant}, {len(ids)} prompts ({args.categories}), {steps} steps; us per step")
    for k in sorted(seconds, key=lambda k: -seconds[k]):
        print(f"{k:24s} {1e6 * seconds[k] / steps:9.1f}   calls/step {calls[k] / steps:.2f}")
    total = sum(kept.values())
    shares = "  ".join(f"{k}: {100 * n / total:.1f} %" for k, n in sorted(kept.items()))
    print(f"nodes the cut kept (of drafts up to {gen.sizer.budget(0)}): {shares}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
