"""Does the load's flash-attention timing choose what runs the engine sooner?

    python -m research.llamacpp_flash_check [--quant q4_1] [--per-category 2] [--probes 3]

`LlamaCppModel(flash_attn="fastest")` times a 512-token prompt and forwards of 1 and 4 rows in
each setting, in contexts of the engine's size, and keeps the one whose prompt plus 128
forwards is sooner, on unless off is 3 % sooner (`lookahead.llamacpp.flash`). Here: that
timing `--probes` times (before, between and after the requests), each beside the same timing
in contexts of only the prompt's size (517 tokens: what the engine did before), then the engine
itself (lookahead, cost-aware trees) and plain in-process decoding in each setting, on the
same Spec-Bench prompts, the four taking turns in an order rotated per prompt. Per setting:
decode tok/s, the request's whole time (prompt included), and the lookahead steps' widths (how
many verify the root alone); then each timing's on/off ratios and choice. Greedy, 128 new
tokens, 2 threads, contexts of 4096.
"""

from __future__ import annotations

import argparse
import collections
import statistics

from benchmarks.llamacpp import gguf_of
from benchmarks.traces import DEFAULT_QUESTIONS, select_questions

SETTINGS = ("off", "on")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m research.llamacpp_flash_check")
    p.add_argument("--quant", default="q4_1")
    p.add_argument("--per-category", type=int, default=2)
    p.add_argument("--probes", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    from lookahead.llamacpp import LlamaCppGenerator, LlamaCppModel, flash

    from research.llamacpp_sizer_check import rotated, run

    qs = select_questions(str(DEFAULT_QUESTIONS), args.per_category)
    path = gguf_of(args.quant)
    n = args.threads
    models = {s: LlamaCppModel(path, 4096, n, flash_attn=s) for s in SETTINGS}
    plains = {s: LlamaCppModel(path, 4096, n, n_seq_max=1, flash_attn=s) for s in SETTINGS}
    gens = {s: LlamaCppGenerator(m) for s, m in models.items()}
    probes = []

    def probe():
        small = flash.PROMPT + max(flash.WIDTHS) + 1
        got = [flash.fastest(plains["off"], c, models["off"].n_batch, n) for c in (4096, small)]
        probes.append(got)
        print(got[0].describe(), flush=True)

    ids = [models["off"].encode(q["turns"][0], chat=True) for q in qs]
    for g in gens.values():
        g.generate(models["off"].encode("Say hello.", chat=True), 8)
    probe()
    methods = [(k, s) for k in ("lookahead", "plain") for s in SETTINGS]
    got = {m: [] for m in methods}  # (decode tok/s, whole request s)
    widths = {s: collections.Counter() for s in SETTINGS}
    for i, x in enumerate(ids):
        if args.probes > 2 and i == len(ids) // 2:
            probe()
        for k, s in rotated(methods, i):
            toks, secs, whole, st = run(plains[s] if k == "plain" else gens[s], x)
            got[k, s].append(((len(toks) - 1) / secs, whole))
            if st is not None:
                widths[s].update(1 + d for d in st.draft_nodes)
        print(qs[i]["category"], "  ".join(f"{k} {s} {got[k, s][-1][0]:.1f}" for k, s in methods),
              flush=True)  # fmt: skip
    if args.probes > 1:
        probe()
    print(f"# {args.quant}, {len(qs)} prompts, 128 new tokens, {n} threads")
    for k in ("lookahead", "plain"):
        off, on = got[k, "off"], got[k, "on"]
        for s in SETTINGS:
            print(f"{k:9s} {s:3s} {statistics.fmean(r[0] for r in got[k, s]):7.1f} tok/s decode  "
                  f"{sum(r[1] for r in got[k, s]):6.2f} s in all")  # fmt: skip
        print(f"{k:9s} on/off: decode tok/s median ratio "
              f"{statistics.median(b[0] / a[0] for a, b in zip(off, on)):.3f}, whole requests' "
              f"time {sum(r[1] for r in on) / sum(r[1] for r in off):.3f}")  # fmt: skip
    for s in SETTINGS:
        w = widths[s]
        total = sum(w.values())
        mix = "  ".join(f"{r}:{c / total:.0%}" for r, c in sorted(w.items()) if c / total >= 0.01)
        print(f"lookahead {s} steps by rows ({total}): {mix}")
    print("timings, on/off of: prompt, 1-row forward, 4-row forward, workload -> choice; in a "
          "context of 4096 tokens (shipped) | of 517 (before)")  # fmt: skip
    for pair in probes:
        cols = []
        for c in pair:
            r = [c.prompt_s["on"] / c.prompt_s["off"]]
            r += [c.forward_s["on"][w] / c.forward_s["off"][w] for w in c.forward_s["on"]]
            r.append(c.workload_s("on") / c.workload_s("off"))
            cols.append("  ".join(f"{v:.3f}" for v in r) + f" -> {c.choice}")
        print("  " + "   |   ".join(cols))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
