"""End to end: `python -m benchmarks e2e` (CPU by default; `--device cuda` on a GPU).

The default model (`--dtype auto`: fp32 on CPUs without native bf16, else bf16), batch 1,
greedy, on a fixed Spec-Bench sample of every category: plain `generate`, HF prompt lookup
decoding (`generate(prompt_lookup_num_tokens=10)`), lookahead as shipped
(`lookahead.hf.LookaheadGenerator`: drafts sized by the measured cost of rows, one cache
kept across the prompts, as a server keeps it; `--fresh-cache`: a new cache per prompt) and
lookahead with each fixed draft policy of `--fixed` (budget/max_budget/min_draft_score, each
with its own cache), and the shipped policy with the target's recycled predictions
(`--recycle on,path`: every tree node's and the prompt's, or the accepted path's and the
prompt's; each with its own cache). All run interleaved per prompt, in an order rotated from prompt to
prompt, so machine drift hits all alike. Reports tokens/s and speed-up over plain decoding
per category, each lookahead's ratio to prompt lookup, tokens per forward and how many
nodes its steps verified, and whether each method's tokens equal plain greedy decoding's.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict

from lookahead.cli import budget_problem
from lookahead.hf.recycling import RECYCLE_MODES
from lookahead.models import DTYPES
from lookahead.output import check_outputs, command_line, header, write_json

from benchmarks.harness import positive_int
from benchmarks.plot import plot_e2e
from benchmarks.traces import CATEGORIES, DEFAULT_QUESTIONS, select_questions

# Lookahead's defaults before drafts were sized by measured costs (CPU: 8 nodes, 16 after a
# step accepted 4+, verify only drafts whose scores sum to 0.85): the reference to beat.
FIXED_DEFAULT = "8/16/0.85"


def fixed_policies(text: str) -> list:
    """`B/M/S,...` as [(budget, max_budget, min_draft_score)]; ValueError if malformed."""
    out = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        parts = item.split("/")
        try:
            if len(parts) != 3:
                raise ValueError
            b, m, sc = int(parts[0]), int(parts[1]), float(parts[2])
        except ValueError:
            raise ValueError(
                f"--fixed wants budget/max_budget/min_draft_score items, got {item!r}"
            ) from None
        if b < 1 or m < b or not 0 <= sc < float("inf"):
            raise ValueError(f"--fixed {item!r}: need 1 <= budget <= max_budget and score >= 0")
        out.append((b, m, sc))
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the end-to-end comparison; see the module docstring."""
    p = argparse.ArgumentParser(prog="python -m benchmarks e2e", description=__doc__.split("\n")[0])
    p.add_argument(
        "--questions",
        default=str(DEFAULT_QUESTIONS),
        help=f"Spec-Bench question.jsonl (default {DEFAULT_QUESTIONS}, see $LOOKAHEAD_SPEC_BENCH)",
    )
    p.add_argument("--per-category", type=positive_int, default=3, help="prompts per category")
    p.add_argument(
        "--categories", default=",".join(CATEGORIES), help="comma-separated subset to run"
    )
    p.add_argument("--max-new-tokens", type=positive_int, default=128, help="per prompt")
    p.add_argument("--model", default=None, help="local HF folder or .gguf (default model)")
    p.add_argument(
        "--dtype",
        default="auto",
        choices=DTYPES,
        help="auto: bf16 on a GPU of sm80+ or a CPU with native bf16, else fp32; only fp32 "
        "output is token-identical to plain decoding",
    )
    p.add_argument("--device", default="cpu", help="torch device: cpu (default) or cuda")
    p.add_argument("--budget", type=int, default=None, help="lookahead draft budget")
    p.add_argument(
        "--max-budget",
        type=int,
        default=None,
        help="lookahead draft budget after a deep acceptance (default: the engine's)",
    )
    p.add_argument(
        "--pld-tokens", type=positive_int, default=10, help="HF prompt lookup's draft length"
    )
    p.add_argument(
        "--fixed",
        default=FIXED_DEFAULT,
        help="fixed draft policies run beside, budget/max_budget/min_draft_score, comma-"
        f"separated ('' for none; default {FIXED_DEFAULT}, the defaults before cost-aware drafts)",
    )
    p.add_argument(
        "--recycle",
        default="",
        help="also run lookahead with recycled predictions: comma-separated modes, 'on' (every "
        "tree node and the prompt) and/or 'path' (the accepted path and the prompt)",
    )
    p.add_argument("--fresh-cache", action="store_true", help="a new lookahead cache per prompt")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--plot", default=None, metavar="PNG", help="draw the tables as a PNG")
    p.add_argument("--json", default=None, help="write the full results here")
    args = p.parse_args(argv)
    check_outputs(args.json, plot=args.plot)
    problem = budget_problem(args)
    if problem:
        p.error(problem)
    if args.threads < 0:
        p.error(f"--threads must be >= 0, got {args.threads}")
    try:
        fixed = fixed_policies(args.fixed)
    except ValueError as err:
        p.error(str(err))
    recycle = [m for m in (x.strip() for x in args.recycle.split(",")) if m]
    if any(m not in ("on", "path") for m in recycle):
        p.error(f"--recycle takes 'on' and/or 'path', got {args.recycle!r}")

    import torch
    from lookahead.hf import LookaheadGenerator
    from lookahead.hf import generate as lookahead_generate
    from lookahead.models import load_model, resolve_dtype
    from tqdm import tqdm

    if args.threads:
        torch.set_num_threads(args.threads)
    cats = [c for c in args.categories.split(",") if c]
    bad = [c for c in cats if c not in CATEGORIES]
    if bad:
        raise SystemExit(f"unknown categories {bad}; choose from {CATEGORIES}")
    questions = select_questions(args.questions, args.per_category, cats)
    try:
        args.dtype = resolve_dtype(args.dtype, args.device)
    except ValueError as err:
        raise SystemExit(f"python -m benchmarks e2e: {err}") from None
    model, tok = load_model(args.model, dtype=args.dtype, device=args.device)
    eos = tok.eos_token_id
    given = {
        k: v for k, v in (("budget", args.budget), ("max_budget", args.max_budget)) if v is not None
    }
    policies = {"lookahead": given}
    for b, m, sc in fixed:
        policies[f"fixed {b}/{m}/{sc:g}"] = dict(budget=b, max_budget=m, min_draft_score=sc)
    for mode in recycle:
        name = "lookahead +recycled" + (" path" if mode == "path" else "")
        policies[name] = dict(given, recycle=RECYCLE_MODES[mode])
    methods = ["plain", "pld", *policies]
    gens = {
        name: (None if args.fresh_cache else LookaheadGenerator(model, tok, **kw))
        for name, kw in policies.items()
    }
    shipped = gens["lookahead"] or LookaheadGenerator(model, tok, **given)
    costs = shipped.cost_model  # measured (or read) before anything is timed
    if costs is not None:
        print(f"verify cost on this machine, {costs.describe(700)}", file=sys.stderr)

    def one_shot(method) -> dict:
        """Generator options of a lookahead method run by `lookahead_generate`: the shipped
        one reuses the curve measured above rather than measuring per prompt."""
        if method.startswith("lookahead") and costs is not None:
            return dict(policies[method], cost_model=costs)
        return policies[method]

    def prompt_ids(q):
        ids = tok.apply_chat_template(
            [{"role": "user", "content": q["turns"][0]}], add_generation_prompt=True, tokenize=True
        )
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    def run(method, ids):
        x = torch.tensor([ids], device=args.device)
        kw = dict(
            attention_mask=torch.ones_like(x),
            do_sample=False,
            max_new_tokens=args.max_new_tokens,
            eos_token_id=eos,
            pad_token_id=eos,
        )
        t0 = time.perf_counter()
        steps = None
        with torch.inference_mode():
            if method == "plain":
                out = model.generate(x, **kw)[0, len(ids) :].tolist()
            elif method == "pld":
                out = model.generate(x, prompt_lookup_num_tokens=args.pld_tokens, **kw)
                out = out[0, len(ids) :].tolist()
            else:
                gen = gens[method]
                if gen is not None:
                    res = gen.generate(ids, max_new_tokens=args.max_new_tokens, do_sample=False)
                else:
                    res = lookahead_generate(
                        model,
                        ids,
                        tok,
                        max_new_tokens=args.max_new_tokens,
                        do_sample=False,
                        **one_shot(method),
                    )
                st = res.stats
                steps = {
                    "forwards": st.steps + 1,  # + the prefill
                    "accepted": sum(st.accepted),
                    "draft_nodes": list(st.draft_nodes),  # verified per step
                    **{
                        k: getattr(st, k)
                        for k in ("draft_s", "mask_s", "forward_s", "verify_s", "kv_s")
                    },
                }
                out = list(res.ids)
        return out, time.perf_counter() - t0, steps

    # Warm-up (kernels, allocator); not timed, not in the lookahead cache's history.
    warm = prompt_ids({"turns": ["Say hello."]})
    for m in methods:
        if m in ("plain", "pld"):
            run(m, warm)
        else:
            lookahead_generate(model, warm, tok, max_new_tokens=4, do_sample=False, **one_shot(m))

    per = defaultdict(
        lambda: defaultdict(lambda: {"tokens": 0, "seconds": 0.0, "prompts": 0, "same_as_plain": 0})
    )
    records = []
    for i, q in enumerate(tqdm(questions, desc="e2e", unit="prompt")):
        cat = q["category"] if q["category"] in CATEGORIES else "mt_bench"
        ids = prompt_ids(q)
        r = i % len(methods)
        order = methods[r:] + methods[:r]
        outs = {}
        for m in order:
            out, secs, steps = run(m, ids)
            if eos in out:
                out = out[: out.index(eos) + 1]
            outs[m] = out
            records.append(
                {
                    "question_id": q["question_id"],
                    "category": cat,
                    "method": m,
                    "new_tokens": len(out),
                    "seconds": secs,
                    **(steps or {}),  # lookahead only: forwards (prefill included), time split
                }
            )
        for m in methods:
            rec = next(r for r in reversed(records) if r["method"] == m)
            for key in (cat, "overall"):
                s = per[m][key]
                s["tokens"] += len(outs[m])
                s["seconds"] += rec["seconds"]
                s["prompts"] += 1
                s["same_as_plain"] += int(outs[m] == outs["plain"])
                if "forwards" in rec:
                    s["forwards"] = s.get("forwards", 0) + rec["forwards"]
                    hist = s.setdefault("nodes_per_step", {})
                    for k in rec["draft_nodes"]:
                        hist[k] = hist.get(k, 0) + 1

    cols = [*[c for c in CATEGORIES if c in cats], "overall"]
    summary = {m: {} for m in methods}
    for m in methods:
        for c in cols:
            s = dict(per[m][c])
            s["tokens_per_s"] = s["tokens"] / s["seconds"] if s["seconds"] else float("nan")
            if "nodes_per_step" in s:
                s["nodes_per_step"] = dict(sorted(s["nodes_per_step"].items()))
            summary[m][c] = s
    for m in methods:
        for c in cols:
            summary[m][c]["speedup"] = (
                summary[m][c]["tokens_per_s"] / summary["plain"][c]["tokens_per_s"]
            )
    print(
        f"\ne2e ({args.dtype}, batch 1, greedy, {args.per_category}/category, "
        f"<= {args.max_new_tokens} new tokens): tokens/s (speed-up over plain)"
    )
    width = max(12, *(len(m) + 2 for m in methods))
    print(f"{'method':<{width}}" + "".join(f"{c[:14]:>18}" for c in cols))
    for m in methods:
        print(
            f"{m:<{width}}"
            + "".join(
                f"{summary[m][c]['tokens_per_s']:>10.2f} ({summary[m][c]['speedup']:.2f}x)"
                for c in cols
            )
        )
    la_methods = methods[2:]
    for m in la_methods:
        print(
            f"{m + ' / PLD':<{width}}"
            + "".join(
                f"{summary[m][c]['tokens_per_s'] / summary['pld'][c]['tokens_per_s']:>17.2f}x"
                for c in cols
            )
        )
    for m in la_methods:
        print(
            f"{m + ' tok/fwd':<{width}}"  # prefill counted as a forward
            + "".join(
                f"{summary[m][c]['tokens'] / max(summary[m][c].get('forwards', 0), 1):>18.2f}"
                for c in cols
            )
        )
    print("nodes verified per step (share of steps):")
    for m in la_methods:
        hist = summary[m]["overall"]["nodes_per_step"]
        n = sum(hist.values()) or 1
        shown = ", ".join(f"{k}: {100 * v / n:.0f}%" for k, v in hist.items() if v / n >= 0.01)
        print(f"  {m}: {shown}")
    learned = getattr(gens["lookahead"], "sizer", None) if gens["lookahead"] else None
    learned = getattr(learned, "learned", None)
    if learned is not None:
        print(f"verify cost measured at start-up, {costs.describe(700)}")
        print(
            f"verify cost learnt from {learned.count} forwards, {learned.as_cost_model().describe(700)}"
        )
    print(
        "outputs equal to plain greedy: "
        + ", ".join(
            f"{m} {summary[m]['overall']['same_as_plain']}/{summary[m]['overall']['prompts']}"
            for m in methods[1:]
        )
    )
    if args.plot:
        plot_e2e(summary, [c for c in cols if c != "overall"], args.plot)
    if args.json:
        res = header(command_line("python -m benchmarks e2e", argv))
        res.update({"config": vars(args), "summary": summary, "records": records})
        if costs is not None:
            res["cost_model"] = costs.to_json()
            if learned is not None:
                res["cost_model_learned"] = learned.as_cost_model().to_json()
                res["cost_model_learned"]["forwards"] = learned.count
        write_json(args.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
