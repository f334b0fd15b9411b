"""`lookahead demo`: plain greedy `model.generate` against lookahead on Spec-Bench prompts.

The package ships a sample of Spec-Bench (`lookahead/data/spec_bench_sample.jsonl`, Apache-2.0,
see `lookahead/data/NOTICE`). Per prompt both methods run back to back (interleaved, so load
drifts on a shared machine hit both alike); the table gives tokens/s of each, the speedup, the
mean tokens per step, and whether the two outputs are identical.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

DEFAULT_CATEGORIES = ("rag", "summarization")
DEFAULT_COUNT = 4


@dataclass
class DemoRow:
    """One prompt's outcome (times in seconds)."""

    question_id: object
    category: str
    prompt_tokens: int
    plain_tokens: int
    lookahead_tokens: int
    plain_s: float
    lookahead_s: float
    steps: int
    mean_accepted: float  # accepted draft tokens per step (bonus not counted)
    tokens_per_step: float  # emitted tokens per step (accepted + bonus)
    host_overhead: float  # (draft + mask + verify + KV fix-up) / forward time
    identical: bool

    @property
    def plain_tps(self) -> float:
        return self.plain_tokens / self.plain_s

    @property
    def lookahead_tps(self) -> float:
        return self.lookahead_tokens / self.lookahead_s

    @property
    def speedup(self) -> float:
        return self.lookahead_tps / self.plain_tps


def load_prompts(path=None, categories=DEFAULT_CATEGORIES, count=DEFAULT_COUNT) -> list:
    """Prompts (dicts with question_id, category, turns) from a JSONL file or the shipped sample.

    `categories` None or empty keeps every category; `count` None keeps every prompt. A
    prompt that is empty or not valid Unicode is refused (ValueError), as `generate` does.
    """
    from lookahead.engine import text_problem

    if path is None:
        text = resources.files("lookahead").joinpath("data/spec_bench_sample.jsonl").read_text()
        source = "the shipped Spec-Bench sample"
    else:
        text = Path(path).read_text()
        source = str(path)
    rows = []
    for i, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{source}, line {i + 1}: not JSON ({e})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{source}, line {i + 1}: needs a JSON object, got {row!r:.60}")
        turns = row.get("turns") or ([row["prompt"]] if "prompt" in row else None)
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
            raise ValueError(f"{source}, line {i + 1}: needs 'turns' (list of strings) or 'prompt'")
        # Refused here as `lookahead generate` refuses them, before the model loads: an empty
        # prompt, and text a tokenizer cannot take (a JSON escape of a lone surrogate).
        if not turns[0]:
            raise ValueError(f"{source}, line {i + 1}: the prompt is empty")
        problem = text_problem(turns[0])
        if problem:
            raise ValueError(f"{source}, line {i + 1}: the prompt {problem}")
        category = row.get("category", "custom")
        if not isinstance(category, str) or not category or category == "overall":
            raise ValueError(
                f"{source}, line {i + 1}: 'category' must be a non-empty string other than "
                f"'overall' (the table's all-prompts row), got {category!r:.60}"
            )
        rows.append(
            {"question_id": row.get("question_id", i), "category": category, "turns": turns}
        )
    if categories:
        known = {r["category"] for r in rows}
        unknown = [c for c in categories if c not in known]
        if unknown:
            raise ValueError(f"unknown categories {unknown}; {source} has {sorted(known)}")
        rows = [r for r in rows if r["category"] in categories]
    if count is not None:
        per_cat: dict = {}
        rows = [r for r in rows if per_cat.setdefault(r["category"], []).append(r) or True]
        rows = [r for c in per_cat for r in per_cat[c][:count]]
    if not rows:
        raise ValueError(f"no prompts selected from {source}")
    return rows


def chat_ids(tokenizer, text: str) -> list:
    """Token ids of `text` as a user turn, with the chat template when the tokenizer has one."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)
    return tokenizer(text)["input_ids"]


def plain_generate(model, ids: list, max_new_tokens: int) -> tuple:
    """Greedy `model.generate`; returns (new ids, seconds)."""
    import torch

    inp = torch.tensor([ids], device=model.device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            inp,
            attention_mask=torch.ones_like(inp),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            temperature=None,
            top_p=None,
            top_k=None,
        )
    return out[0, len(ids) :].tolist(), time.perf_counter() - t0


def run(
    model,
    tokenizer,
    prompts,
    *,
    max_new_tokens,
    budget=None,
    max_budget=None,
    depth=12,
    multi_branch=True,
    min_draft_score=None,
):
    """Run both methods on every prompt; yields `DemoRow`s as they finish. A prompt longer
    than the model's context is refused (`InvalidInput`) before any prompt runs."""
    from lookahead.engine import LookaheadGenerator, context_length
    from lookahead.errors import InvalidInput

    gen = LookaheadGenerator(
        model,
        tokenizer,
        budget=budget,
        max_budget=max_budget,
        depth=depth,
        multi_branch=multi_branch,
        min_draft_score=min_draft_score,
    )
    # The engine refuses such a prompt too, but only when its turn comes: the rows before it
    # would be lost.
    encoded = [chat_ids(tokenizer, p["turns"][0]) for p in prompts]
    ctx = context_length(model, tokenizer)
    for p, ids in zip(prompts, encoded):
        if ctx is not None and len(ids) > ctx:
            raise InvalidInput(
                f"prompt {p['question_id']} ({p['category']}) has {len(ids)} tokens, more than "
                f"the model's context of {ctx} positions (max_position_embeddings)"
            )
    # Warm-up: first calls pay one-off costs (thread pools, allocator) that are not decoding.
    warm = chat_ids(tokenizer, "Say hello.")
    plain_generate(model, warm, 4)
    gen.generate(warm, max_new_tokens=4, do_sample=False)
    for p, ids in zip(prompts, encoded):
        plain_ids, plain_s = plain_generate(model, ids, max_new_tokens)
        # Greedy, as plain_generate (a model's generation config may ask for sampling).
        res = gen.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
        s = res.stats
        yield DemoRow(
            question_id=p["question_id"],
            category=p["category"],
            prompt_tokens=len(ids),
            plain_tokens=len(plain_ids),
            lookahead_tokens=len(res.ids),
            plain_s=plain_s,
            lookahead_s=s.total_s,
            steps=s.steps,
            mean_accepted=s.mean_accepted,
            tokens_per_step=s.tokens_per_step,
            host_overhead=s.host_overhead,
            identical=plain_ids == res.ids,
        )


HEADER = (
    f"{'id':>6} {'category':<14} {'prompt':>6} {'new':>5} {'plain tok/s':>11} "
    f"{'lookahead tok/s':>15} {'speedup':>7} {'acc/step':>8} {'tok/step':>8} {'identical':>9}"
)


def format_row(r: DemoRow) -> str:
    """One table line."""
    return (
        f"{r.question_id!s:>6} {r.category:<14} {r.prompt_tokens:>6} {r.lookahead_tokens:>5} "
        f"{r.plain_tps:>11.1f} {r.lookahead_tps:>15.1f} {r.speedup:>6.2f}x "
        f"{r.mean_accepted:>8.2f} {r.tokens_per_step:>8.2f} {'yes' if r.identical else 'NO':>9}"
    )


def summarize(rows: list) -> list:
    """Per-category and overall summaries: median speedup, mean acc/step, identical share."""
    groups: dict = {}
    for r in rows:
        groups.setdefault(r.category, []).append(r)
    groups["overall"] = list(rows)
    out = []
    for cat, rs in groups.items():
        out.append(
            {
                "category": cat,
                "prompts": len(rs),
                "median_speedup": statistics.median(r.speedup for r in rs),
                "mean_accepted": statistics.fmean(r.mean_accepted for r in rs),
                "tokens_per_step": statistics.fmean(r.tokens_per_step for r in rs),
                "plain_tps": statistics.fmean(r.plain_tps for r in rs),
                "lookahead_tps": statistics.fmean(r.lookahead_tps for r in rs),
                "identical": sum(r.identical for r in rs),
                "host_overhead": statistics.fmean(r.host_overhead for r in rs),
            }
        )
    return out


def format_summary(summary: list, dtype: str) -> str:
    """Summary lines, one per category and one overall."""
    lines = []
    for s in summary:
        lines.append(
            f"{s['category']:<14} median speedup {s['median_speedup']:.2f}x  mean: "
            f"plain {s['plain_tps']:.1f} tok/s  lookahead {s['lookahead_tps']:.1f} tok/s  "
            f"acc/step {s['mean_accepted']:.2f}  tok/step {s['tokens_per_step']:.2f}  "
            f"identical {s['identical']}/{s['prompts']}  host overhead "
            f"{100 * s['host_overhead']:.1f}% of forward  [{dtype}]"
        )
    return "\n".join(lines)


def plot(rows: list, summary: list, path: str, dtype: str) -> None:
    """Bar charts of median speedup and mean accepted tokens per step, per category."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cats = [s["category"] for s in summary]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    axes[0].bar(cats, [s["median_speedup"] for s in summary], color="tab:blue")
    axes[0].axhline(1.0, color="grey", lw=0.8)
    axes[0].set_ylabel("median speedup over model.generate")
    axes[1].bar(cats, [s["mean_accepted"] for s in summary], color="tab:orange")
    axes[1].set_ylabel("accepted draft tokens / step")
    for ax in axes:
        ax.tick_params(axis="x", rotation=20)
    fig.suptitle(f"lookahead demo ({dtype}, {len(rows)} prompts)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def busy_note(load: float | None = None, cores: int | None = None) -> str | None:
    """A warning when the last minute's load average says other work shared the CPUs (the
    demo alone keeps it near the core count), else None."""
    if load is None:
        if not hasattr(os, "getloadavg"):
            return None
        load = os.getloadavg()[0]
    cores = cores or os.cpu_count() or 1
    if load <= 1.5 * cores:
        return None
    return (
        f"note: load average {load:.1f} on {cores} cores: other work shared the CPUs, so the "
        "tok/s and speedups are noisy (tok/step and identical are not); rerun on a quiet "
        "machine to time it"
    )


def main(args) -> int:
    """Entry point for `lookahead demo` (arguments parsed by `lookahead.cli`)."""
    import torch
    from tqdm import tqdm

    from lookahead.models import load_model, resolve_dtype

    if args.categories is None:  # the sample's copy-heavy categories; a user's file: all
        categories = DEFAULT_CATEGORIES if args.prompts is None else None
    else:
        categories = [c for c in args.categories.split(",") if c] or None
    prompts = load_prompts(args.prompts, categories, args.count)
    t0 = time.perf_counter()
    device = getattr(args, "device", "cpu")
    args.dtype = resolve_dtype(args.dtype, device)
    model, tok = load_model(args.model, args.dtype, device=device)
    print(
        f"model {model.config._name_or_path} ({args.dtype}, {model.config._attn_implementation}) "
        f"loaded in {time.perf_counter() - t0:.1f}s; torch threads {torch.get_num_threads()}; "
        f"{len(prompts)} prompts, max {args.max_new_tokens} new tokens",
        file=sys.stderr,
    )
    rows: list = []
    print(HEADER)
    it = run(
        model,
        tok,
        prompts,
        max_new_tokens=args.max_new_tokens,
        budget=args.budget,
        max_budget=args.max_budget,
        depth=args.depth,
        multi_branch=not args.single_branch,
        min_draft_score=getattr(args, "min_draft_score", None),
    )
    with tqdm(total=len(prompts), desc="prompts", unit="prompt", file=sys.stderr) as bar:
        for row in it:
            rows.append(row)
            tqdm.write(format_row(row), file=sys.stdout)
            bar.update(1)
    summary = summarize(rows)
    print()
    print(format_summary(summary, args.dtype))
    busy = busy_note()
    if busy:
        print(busy, file=sys.stderr)
    if args.json:
        from lookahead.bench.harness import command_line, header, write_output

        payload = {
            **header(command_line("lookahead", None)),
            "device": getattr(args, "device", "cpu"),
            "dtype": args.dtype,
            "max_new_tokens": args.max_new_tokens,
            "budget": args.budget,  # None: the engine's default for the dtype
            "max_budget": args.max_budget,  # None: the engine's default
            "threads": torch.get_num_threads(),
            "depth": args.depth,
            "multi_branch": not args.single_branch,
            "rows": [
                {
                    **asdict(r),
                    "speedup": r.speedup,
                    "plain_tps": r.plain_tps,
                    "lookahead_tps": r.lookahead_tps,
                }
                for r in rows
            ],
            "summary": summary,
        }
        write_output(args.json, json.dumps(payload, indent=2))
    if args.plot:
        plot(rows, summary, args.plot, args.dtype)
    return 0
