"""`lookahead demo`: plain greedy `model.generate`, HF prompt lookup and lookahead on
Spec-Bench prompts.

The package ships a sample of Spec-Bench (`lookahead/data/spec_bench_sample.jsonl`, Apache-2.0,
see `lookahead/data/NOTICE`). Per prompt the three methods run back to back, in an order rotated
from prompt to prompt (so load drifts on a shared machine hit all alike); the table gives
tokens/s of each, lookahead's speedup over plain decoding and over prompt lookup, tokens per
step, and whether each output is identical to plain decoding's. An output that is not is
explained (`lookahead.forks`): a near-tie fork within what this dtype's rounding can move a
logit (measured at start-up), or a bug, which makes the demo exit 1.
"""

from __future__ import annotations

import sys
import time
from importlib import resources

from lookahead.demo_table import DemoRow, Peer, show
from lookahead.hf.recycling import RECYCLE_MODES
from lookahead.user_input import decode, loads_json, quote, read_file

# The largest prompt file read (Spec-Bench's 480 prompts are 0.6 MB).
MAX_PROMPT_FILE_BYTES = 64 << 20
DEFAULT_CATEGORIES = ("rag", "summarization")
DEFAULT_COUNT = 4


def load_prompts(path=None, categories=DEFAULT_CATEGORIES, count=DEFAULT_COUNT) -> list:
    """Prompts (dicts with question_id, category, turns) from a JSONL file or the shipped sample.

    `categories` None or empty keeps every category; `count` None keeps every prompt. A
    prompt that is empty or not valid Unicode is refused (ValueError), as `generate` does.
    """
    from lookahead.hf import text_problem

    if path is None:
        text = resources.files("lookahead").joinpath("data/spec_bench_sample.jsonl").read_text()
        source = "the shipped Spec-Bench sample"
    else:
        source = str(path)
        text = decode(
            read_file(path, MAX_PROMPT_FILE_BYTES, "prompt file"), f"prompt file {source}"
        )
    rows = []
    for i, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        row = loads_json(line, f"{source}, line {i + 1}")
        if not isinstance(row, dict):
            raise ValueError(f"{source}, line {i + 1}: needs a JSON object, got {quote(row)}")
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
                f"'overall' (the table's all-prompts row), got {quote(category)}"
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


# HF prompt lookup's tokens per draft: the value transformers' docs use.
PLD_TOKENS = 10
# The table's peer column: HF prompt lookup.
PLD = Peer("PLD", "prompt lookup")


def plain_generate(model, ids: list, max_new_tokens: int, **kw) -> tuple:
    """Greedy `model.generate` (with `kw`, e.g. `prompt_lookup_num_tokens`); returns (new
    ids, seconds)."""
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
            **kw,
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
    recycle=False,
    pld=True,
    bound=None,
):
    """Run the methods on every prompt; yields `DemoRow`s as they finish. `pld`: also HF
    prompt lookup. `bound`: the rounding bound for fork checks (None: measured here on the
    first prompt, `lookahead.forks.rounding_bound`). A prompt longer than the model's
    context is refused (`InvalidInput`) before any prompt runs."""
    from lookahead.errors import InvalidInput
    from lookahead.forks import explain_fork
    from lookahead.hf import LookaheadGenerator, context_length

    gen = LookaheadGenerator(
        model,
        tokenizer,
        budget=budget,
        max_budget=max_budget,
        depth=depth,
        multi_branch=multi_branch,
        min_draft_score=min_draft_score,
        recycle=recycle,
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
    if pld:
        plain_generate(model, warm, 4, prompt_lookup_num_tokens=PLD_TOKENS)
    gen.generate(warm, max_new_tokens=4, do_sample=False)
    if bound is None:
        bound = measure_bound(model, encoded[0])
    methods = ["plain", "pld", "lookahead"] if pld else ["plain", "lookahead"]
    for k, (p, ids) in enumerate(zip(prompts, encoded)):
        out = {}
        for m in methods[k % len(methods) :] + methods[: k % len(methods)]:
            if m == "plain":
                out[m] = plain_generate(model, ids, max_new_tokens)
            elif m == "pld":
                out[m] = plain_generate(
                    model, ids, max_new_tokens, prompt_lookup_num_tokens=PLD_TOKENS
                )
            else:
                # Greedy, as plain_generate (a model's generation config may ask for sampling).
                out[m] = gen.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
        plain_ids, plain_s = out["plain"]
        res = out["lookahead"]
        peer = None
        if "pld" in out:
            pld_ids, pld_s = out["pld"]
            peer = (pld_ids, pld_s, explain_fork(model, ids, plain_ids, pld_ids, bound))
        fork = explain_fork(model, ids, plain_ids, res.ids, bound)
        yield DemoRow.of(p, ids, plain_ids, plain_s, res, fork, peer)


def measure_bound(model, ids: list) -> float:
    """`lookahead.forks.rounding_bound` over the last 32 positions of `ids` (the first
    prompt: this model, dtype and device, at a real prompt's logit magnitudes)."""
    from lookahead.forks import rounding_bound

    return rounding_bound(model, ids, rows=32)


def selected_prompts(args) -> list:
    """The prompts `args` selects (`--prompts`, `--categories`, `--count`)."""
    if args.categories is None:  # the sample's copy-heavy categories; a user's file: all
        categories = DEFAULT_CATEGORIES if args.prompts is None else None
    else:
        categories = [c for c in args.categories.split(",") if c] or None
    return load_prompts(args.prompts, categories, args.count)


def main(args) -> int:
    """Entry point for `lookahead demo` (arguments parsed by `lookahead.cli`)."""
    prompts = selected_prompts(args)
    if getattr(args, "engine", "hf") == "llamacpp":
        from lookahead.llamacpp.demo import main as llamacpp_main

        return llamacpp_main(args, prompts)
    import torch

    from lookahead.models import cpu_features, load_model, resolve_dtype

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
    pld = not getattr(args, "no_pld", False)
    bound = measure_bound(model, chat_ids(tok, prompts[0]["turns"][0]))
    features = cpu_features() if device == "cpu" else []
    print(
        f"# {args.dtype} on {device}" + (f" (CPU: {', '.join(features) or 'no AVX2'})" if device == "cpu" else "")
        + f"; tok/s of plain model.generate, HF prompt lookup (PLD, {PLD_TOKENS} tokens) and "
        f"lookahead; a fork within {bound:.3g} (twice what rounding moved a competing logit "
        "between one-row and multi-row forwards here) is a near-tie, beyond it a bug"
    )  # fmt: skip
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
        recycle=RECYCLE_MODES[getattr(args, "recycle", "off")],
        pld=pld,
        bound=bound,
    )
    fields = {
        "device": device,
        "dtype": args.dtype,
        "max_new_tokens": args.max_new_tokens,
        "budget": args.budget,  # None: drafts sized by the measured verify cost
        "max_budget": args.max_budget,  # None: as budget
        "threads": torch.get_num_threads(),
        "depth": args.depth,
        "multi_branch": not args.single_branch,
        "cpu_features": features,
        "pld_tokens": PLD_TOKENS if pld else None,
        "rounding_bound": bound,
    }
    return show(it, len(prompts), args, args.dtype, fields, bound, PLD)
