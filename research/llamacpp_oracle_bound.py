"""The most any drafter could give on llama.cpp here: an oracle that drafts plain's own text.

    python -m research.llamacpp_oracle_bound [--quant q4_1] [--widths 2,4,8,16] [--rounds 2] [--tries 8] [--json F]

On the demo's prompts (`lookahead.demo.load_prompts`: 4 summarization, 4 rag, chat template,
256 new tokens, greedy), per prompt and round, in an order rotated from prompt to prompt:
plain llama.cpp decoding (`plain_generate`, a one-sequence context), lookahead (the engine
with its cost-aware sizer, its own context), and for each width W an oracle that verifies, at
every step, the next W - 1 tokens of plain's output as a chain in the engine's context and
forward (`tree_batch`, `SequenceBook`), so that where the forward's argmax is plain's it
accepts all of them and the bonus: W tokens a forward, no drafter cost, no rejected row. Where
a W-row forward forks from plain's text (a near-tie that rounds the other way in a wider
forward) the oracle's text is that forward's own: found untimed, before the rounds, by
rerunning it on the text it gave until it verifies its own text throughout; its forks from
plain's are listed with their margins (`lookahead.llamacpp.forks`).

The ratio is the demo's: tokens a second including the prompt's forward, over plain's, per
prompt (the mean over rounds), then the median over prompts; "after the prompt" leaves the
prompt's forward out of both; "at plain's length" is plain's prompt time plus its decode time
divided by the method's speed-up after the prompt, over plain's time (a fork changes a text's
length, and with it how much the prompt weighs in tokens a second). No drafter verifying on
these forwards does better than the best width's oracle: what bounds issue 32's demo on a CPU
and file (research/README.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from lookahead.forks import first_difference
from lookahead.llamacpp.tree import SequenceBook, argmax_rows, greedy_path, tree_batch

from research.llamacpp_sizer_check import rotated


def oracle_generate(model, ids: list, ref: list, n: int, width: int) -> dict:
    """Greedy decoding of `ids` in `model` (sequence 0, the engine's context) where each
    forward verifies the chain of `ref`'s next `width - 1` tokens while the output is `ref`'s
    so far. Returns tokens, prefill_s, total_s, steps and where it forked from `ref` (None)."""
    t0 = time.perf_counter()
    model.reset()
    book = SequenceBook(model)
    row = model.prefill(list(ids), [0])
    book.reset(len(ids))
    prefill_s = time.perf_counter() - t0
    out = [int(row.argmax())]
    n_past, steps, fork = len(ids), 0, None
    while len(out) < n and not model.is_eog(out[-1]):
        on_ref = fork is None and out == ref[: len(out)]
        if fork is None and not on_ref:
            fork = fork_at(out, ref)
        k = min(width - 1, n - len(out)) if on_ref else 0
        tokens = [out[-1]] + [int(t) for t in ref[len(out) : len(out) + k]]
        parents = list(range(-1, len(tokens) - 1))
        batch = tree_batch(tokens, parents, n_past, model.n_seq_max)
        book.ready(1, n_past)
        rows = model.decode(*batch, [True] * len(tokens), copy=False)
        path, bonus = greedy_path(tokens, parents, argmax_rows(rows))
        book.keep(batch[2], path, n_past)
        n_past += len(path)
        steps += 1
        for t in [tokens[i] for i in path[1:]] + [bonus]:
            out.append(int(t))
            if len(out) >= n or model.is_eog(out[-1]):
                break
    total_s = time.perf_counter() - t0
    if fork is None:
        fork = fork_at(out, ref)
    return {"tokens": out, "prefill_s": prefill_s, "total_s": total_s, "steps": steps,
            "fork": fork}  # fmt: skip


def fork_at(out: list, ref: list) -> int | None:
    """The first position where `out` and `ref` differ (None where one is the other's start)."""
    i = first_difference(out, ref)
    return None if i == min(len(out), len(ref)) else i


def oracle_text(model, ids: list, plain: list, n: int, width: int, tries: int = 8) -> list:
    """The text an oracle of `width` verifies in full: plain's output, then, where a wider
    forward forks from it (a near-tie rounded the other way), that forward's own text,
    until a run verifies its text without a fork (at most `tries` runs)."""
    ref = plain
    for _ in range(tries):
        run = oracle_generate(model, ids, ref, n, width)
        if run["fork"] is None:
            return ref
        ref = run["tokens"]
    return ref


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m research.llamacpp_oracle_bound")
    p.add_argument("--quant", default="q4_1")
    p.add_argument("--widths", default="2,3,4,6,8,12,16")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tries", type=int, default=8, help="runs to find an oracle's text")
    p.add_argument("--json", help="write every run's tokens and times here")
    args = p.parse_args(argv)
    try:
        widths = [int(w) for w in args.widths.split(",")]
    except ValueError:
        p.error(f"--widths must be integers joined by commas, got {args.widths!r}")
    if min(widths) < 2:
        p.error(f"each width must be at least 2 (the root and one drafted token), got {widths}")
    if min(args.rounds, args.tries, args.max_new_tokens, args.threads) < 1:
        p.error("--rounds, --tries, --max-new-tokens and --threads must be at least 1")

    from lookahead.demo import load_prompts
    from lookahead.demo_table import at_plain_length
    from lookahead.llamacpp import LlamaCppGenerator, LlamaCppModel, plain_generate
    from lookahead.llamacpp.forks import explain_fork, rounding_bound
    from lookahead.models import cpu_features

    from benchmarks.llamacpp import gguf_of

    n = args.max_new_tokens
    path = gguf_of(args.quant)
    m = LlamaCppModel(path, n_threads=args.threads)  # flash attention as the load timing chose
    pm = LlamaCppModel(path, m.n_ctx, args.threads, n_seq_max=1, flash_attn=m.flash_attn)
    gen = LlamaCppGenerator(m)
    prompts = load_prompts()
    encoded = [m.encode(q["turns"][0], chat=True) for q in prompts]
    print(f"# {path.name}, {args.threads} threads, flash attention {m.flash_attn}, CPU: "
          f"{', '.join(cpu_features())}; {len(prompts)} demo prompts, {n} new tokens, "
          f"{args.rounds} rounds; widths {widths}")  # fmt: skip
    gen.generate(m.encode("Say hello.", chat=True), 4)  # warm-up, as the demo's
    plain_refs = [plain_generate(pm, ids, n) for ids in encoded]
    refs = {}  # (prompt, width) -> the oracle's text: what its own verifies give (untimed)
    for k, ids in enumerate(encoded):
        for w in widths:
            refs[(k, w)] = oracle_text(m, ids, plain_refs[k], n, w, args.tries)
    bound = rounding_bound(pm, m, encoded[0])
    forks = [(prompts[k]["question_id"], w, explain_fork(pm, encoded[k], plain_refs[k], r, bound))
             for (k, w), r in refs.items()]  # fmt: skip
    forks = [(q, w, f) for q, w, f in forks if f is not None]
    print(f"# the oracles' texts fork from plain's in {len(forks)} of {len(refs)} (prompt, "
          f"width) pairs, {sum(not f.near_tie for _, _, f in forks)} beyond the rounding bound "
          f"{bound:.3g}: " + ", ".join(f"{q}/W{w} at {f.position} ({f.margin:.3g})"
                                       for q, w, f in forks))  # fmt: skip
    methods = ["plain", "lookahead"] + [f"oracle-{w}" for w in widths]
    runs: dict = {(k, meth): [] for k in range(len(prompts)) for meth in methods}
    for r in range(args.rounds):
        for k, ids in enumerate(encoded):
            for meth in rotated(methods, k + r):
                if meth == "plain":
                    t: dict = {}
                    toks = plain_generate(pm, ids, n, times=t)
                    row = {"tokens": toks, "prefill_s": t["prefill_s"], "total_s": t["total_s"],
                           "steps": len(toks) - 1, "fork": None}  # fmt: skip
                elif meth == "lookahead":
                    res = gen.generate(ids, n)
                    st = res.stats
                    row = {"tokens": res.ids, "prefill_s": st.prefill_s, "total_s": st.total_s,
                           "steps": st.steps, "fork": None}  # fmt: skip
                else:
                    w = int(meth.split("-")[1])
                    row = oracle_generate(m, ids, refs[(k, w)], n, w)
                    row["missed"] = row["fork"]  # where a verify left the oracle's own text
                row["fork"] = fork_at(row["tokens"], plain_refs[k])
                runs[(k, meth)].append(row)
        print(f"# round {r + 1} done", file=sys.stderr)

    def rate(row, after: bool) -> float:
        toks = len(row["tokens"]) - (1 if after else 0)  # the first token is the prompt's
        return toks / (row["total_s"] - (row["prefill_s"] if after else 0.0))

    def ratio(k: int, meth: str, after: bool) -> float:
        pairs = zip(runs[(k, meth)], runs[(k, "plain")])
        return statistics.mean(rate(a, after) / rate(b, after) for a, b in pairs)

    def same_length(k: int, meth: str) -> float:
        """The ratio with the method's decode speed on plain's text: plain's prompt and
        decode times (means over rounds), the decode divided by the method's speed-up
        after the prompt. A fork changes a text's length, and with it how much the prompt
        weighs in tokens a second; this does not."""
        pl = runs[(k, "plain")]
        pre = statistics.mean(x["prefill_s"] for x in pl)
        total = statistics.mean(x["total_s"] for x in pl)
        return at_plain_length(total, pre, ratio(k, meth, True))

    print("\nper prompt: ratio to plain including the prompt / at plain's length (tokens a "
          "forward); forks from plain's text")  # fmt: skip
    print("| prompt | plain tok/s | prompt share | " + " | ".join(methods[1:]) + " |")
    print("|---" * (len(methods) + 2) + "|")
    for k, q in enumerate(prompts):
        pl = runs[(k, "plain")]
        share = statistics.mean(x["prefill_s"] / x["total_s"] for x in pl)
        cells = []
        for meth in methods[1:]:
            rs = runs[(k, meth)]
            tps = statistics.mean((len(x["tokens"]) - 1) / max(x["steps"], 1) for x in rs)
            forks = sorted({x["fork"] for x in rs if x["fork"] is not None})
            missed = sorted({x["missed"] for x in rs if x.get("missed") is not None})
            cells.append(f"{ratio(k, meth, False):.2f}x / {same_length(k, meth):.2f}x"
                         f" ({tps:.2f})"
                         + (f" fork@{forks}" if forks else "")
                         + (f" missed@{missed}" if missed else ""))  # fmt: skip
        print(f"| {q['question_id']} {q['category']} | {statistics.mean(rate(x, False) for x in pl):.1f}"
              f" | {share:.0%} | " + " | ".join(cells) + " |")  # fmt: skip
    print("\nmedian over prompts of the ratio to plain: including the prompt / at plain's "
          "length / after the prompt")  # fmt: skip
    ks = range(len(prompts))
    for meth in methods[1:]:
        inc = statistics.median(ratio(k, meth, False) for k in ks)
        same = statistics.median(same_length(k, meth) for k in ks)
        aft = statistics.median(ratio(k, meth, True) for k in ks)
        print(f"{meth:>12}: {inc:.3f}x / {same:.3f}x / {aft:.3f}x")
    best = [statistics.median(max(f(k, meth) for meth in methods[2:]) for k in ks)
            for f in (lambda k, meth: ratio(k, meth, False), same_length)]  # fmt: skip
    print(
        f"{'oracle-best':>12}: {best[0]:.3f}x / {best[1]:.3f}x (each prompt's best width, "
        "chosen in hindsight)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"file": path.name, "flash_attn": m.flash_attn, "widths": widths,
                       "cpu_features": cpu_features(), "max_new_tokens": n,
                       "prompts": [q["question_id"] for q in prompts],
                       "plain_refs": plain_refs,
                       "runs": [{"prompt": prompts[k]["question_id"], "method": meth,
                                 "rows": rows} for (k, meth), rows in runs.items()]},
                      f)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
