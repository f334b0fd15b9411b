"""Where does the llama.cpp engine's time per token go, against what its sizer modelled?

    make llama-server      # llama-quantize, for the Q4_0 / F16 files
    python -m research.llamacpp_step_costs [--quant q4_0] [--category rag] [--prompts 3]

For Spec-Bench prompts of one category (chat template, 128 new tokens, 2 threads), plain
decoding and lookahead run one after the other per prompt, in one process, on one model.
Every `llama_decode` is timed. Per prompt: plain's forward seconds per token; lookahead's,
split into its one-row forwards and its drafted ones (chains and trees), each against
what one plain row at that context costs; and the drafted forwards' time against the
sizer's learnt curve as it stands after the prompt (so already corrected by these very
forwards: an under-prediction left there was larger when the sizer chose them). If drafted forwards run dearer
than the curve says, the sizer over-drafts; if lookahead's tokens per step at their cost
still lose, the acceptance is what is short.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from benchmarks.harness import run_script


class Timed:
    """Wraps a model's `decode`: every forward's (rows, branches, first position, seconds)."""

    def __init__(self, model):
        self.log, self._decode = [], model.decode
        model.decode = self

    def __call__(self, tokens, positions, seqs, want, copy=True):
        t0 = time.perf_counter()
        out = self._decode(tokens, positions, seqs, want, copy=copy)
        branches = len({s for ss in seqs for s in ss})
        self.log.append((len(tokens), branches, int(positions[0]), time.perf_counter() - t0))
        return out


def main(argv: list[str]) -> int:
    from lookahead.llamacpp import LlamaCppGenerator, LlamaCppModel, plain_generate

    from benchmarks.llamacpp import gguf_of
    from benchmarks.traces import DEFAULT_QUESTIONS, select_questions

    ap = argparse.ArgumentParser(prog="python -m research.llamacpp_step_costs")
    ap.add_argument("--quant", default="q4_0")
    ap.add_argument("--category", default="rag")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args(argv)
    # flash attention as llama.cpp's default gave it when this was measured (before 5bf55b5)
    m = LlamaCppModel(gguf_of(args.quant), n_ctx=4096, n_threads=2, flash_attn="auto")
    gen = LlamaCppGenerator(m)
    timed = Timed(m)
    gen.generate(m.encode("Say hello.", chat=True), 16)  # warm-up: the sizer starts
    qs = [q for q in select_questions(DEFAULT_QUESTIONS, args.prompts)
          if q["category"] == args.category]  # fmt: skip
    n = args.max_new_tokens
    tot = {"plain": 0.0, "la": 0.0, "drafted": 0.0, "model": 0.0, "base": 0.0}
    toks = {"plain": 0, "la": 0}
    for q in qs:
        ids = m.encode(q["turns"][0], chat=True)
        timed.log.clear()
        out = plain_generate(m, ids, n)
        plain = [x for x in timed.log if x[2] >= len(ids)]
        row_s = {p: s for _, _, p, s in plain}  # one row's seconds at each position
        one_row = statistics.median(s for *_, s in plain)
        timed.log.clear()
        res = gen.generate(ids, n)
        steps = [x for x in timed.log if x[2] >= len(ids)]
        curve = gen.sizer.learned
        one = [s for r, _, _, s in steps if r == 1]
        wide = [(r, b, p, s) for r, b, p, s in steps if r > 1]
        model_s = sum(float(curve.curve(p)[r]) for r, _, p, _ in wide)
        base = sum(row_s.get(p, one_row) for _, _, p, _ in wide)
        wide_s = sum(s for *_, s in wide)
        same = "same" if res.ids == out[: len(res.ids)] else "forked"
        print(f"prompt {q['question_id']} ({len(ids)} tokens, {same}): plain "
              f"{1e3 * sum(s for *_, s in plain) / len(out):.2f} ms/token ({len(out)}); lookahead "
              f"{1e3 * sum(s for *_, s in steps) / len(res.ids):.2f} ms/token ({len(res.ids)}, "
              f"{len(res.ids) / max(len(steps), 1):.2f}/step); one-row forwards {len(one)} at "
              f"{1e3 * statistics.median(one) if one else 0:.2f} ms (plain {1e3 * one_row:.2f}); "
              f"drafted forwards {len(wide)} ({sum(b > 1 for _, b, _, _ in wide)} trees, "
              f"{np.mean([r for r, *_ in wide]) if wide else 0:.1f} rows): {1e3 * wide_s:.1f} ms, "
              f"{wide_s / max(base, 1e-9):.2f}x plain rows, learnt curve says "
              f"{1e3 * model_s:.1f} ms")  # fmt: skip
        tot["plain"] += sum(s for *_, s in plain)
        tot["la"] += sum(s for *_, s in steps)
        tot["drafted"] += wide_s
        tot["model"] += model_s
        tot["base"] += base
        toks["plain"] += len(out)
        toks["la"] += len(res.ids)
    print(f"all: plain {1e3 * tot['plain'] / toks['plain']:.2f} ms/token, lookahead "
          f"{1e3 * tot['la'] / toks['la']:.2f} ms/token; drafted forwards "
          f"{tot['drafted'] / max(tot['base'], 1e-9):.2f}x a plain row, "
          f"{tot['drafted'] / max(tot['model'], 1e-9):.2f}x the learnt curve")  # fmt: skip
    return 0


if __name__ == "__main__":
    run_script(main, __doc__)
