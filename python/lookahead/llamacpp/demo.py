"""`lookahead demo --engine llamacpp`: plain llama.cpp greedy decoding and lookahead on
llama.cpp, on the demo's prompts, in the HF demo's table (`lookahead.demo_table.show`).

Plain decoding runs in a context of one sequence, one token per `llama_decode`, as llama.cpp
decodes without speculation; lookahead runs in the engine's own context. Per prompt the two
run back to back, in an order rotated from prompt to prompt. An output that differs from
plain's is explained (`lookahead.llamacpp.forks`): a near-tie within what this CPU's kernels
move a logit between one-row and multi-row forwards, or a bug (exit 1). llama.cpp's own
n-gram speculators (`llama-server --spec-type ...`) are a server binary, not this library:
`python -m benchmarks llamacpp` runs them beside this engine (after `make llama-server`).
"""

from __future__ import annotations

import sys
import time

from lookahead.demo_table import DemoRow


def run(plain, gen, prompts, encoded, max_new_tokens: int, bound: float):
    """Yields a `DemoRow` per prompt (plain: `plain_generate` on `plain`, a one-sequence
    context of the same GGUF; lookahead: `gen`)."""
    from lookahead.llamacpp.forks import explain_fork
    from lookahead.llamacpp.generator import plain_generate

    for k, (p, ids) in enumerate(zip(prompts, encoded)):
        out = {}
        for m in ("plain", "lookahead")[k % 2 :] + ("plain", "lookahead")[: k % 2]:
            t0 = time.perf_counter()
            if m == "plain":
                out[m] = (plain_generate(plain, ids, max_new_tokens), time.perf_counter() - t0)
            else:
                out[m] = gen.generate(ids, max_new_tokens)
        plain_ids, plain_s = out["plain"]
        res = out["lookahead"]
        fork = explain_fork(plain, ids, plain_ids, res.ids, bound)
        yield DemoRow.of(p, ids, plain_ids, plain_s, res, fork)


def main(args, prompts: list) -> int:
    """`lookahead demo --engine llamacpp` (arguments checked by `lookahead.cli`)."""
    from lookahead.demo_table import show
    from lookahead.errors import InvalidInput
    from lookahead.llamacpp.commands import generator
    from lookahead.llamacpp.forks import rounding_bound
    from lookahead.llamacpp.generator import check_request
    from lookahead.llamacpp.model import LlamaCppModel
    from lookahead.models import cpu_features

    t0 = time.perf_counter()
    gen, label = generator(args)
    tree = gen.model
    plain = LlamaCppModel(tree.path, n_ctx=tree.n_ctx, n_threads=args.threads, n_seq_max=1)
    encoded = [tree.encode(p["turns"][0], chat=True) for p in prompts]
    for p, ids in zip(prompts, encoded):  # refused before any prompt runs
        try:
            check_request(tree, ids, args.max_new_tokens)
        except ValueError as e:
            raise InvalidInput(f"prompt {p['question_id']} ({p['category']}): {e}") from None
    gen.generate(tree.encode("Say hello.", chat=True), 4)  # warm-up
    bound = rounding_bound(plain, tree, encoded[0])
    print(
        f"model {tree.path} loaded, start-up cost curve measured in "
        f"{time.perf_counter() - t0:.1f}s; {len(prompts)} prompts, max "
        f"{args.max_new_tokens} new tokens",
        file=sys.stderr,
    )
    features = cpu_features()
    cost = gen.cost_model
    print(
        f"# {label} (CPU: {', '.join(features) or 'no AVX2'}); tok/s of plain llama.cpp greedy "
        "decoding and lookahead (llama.cpp's own n-gram speculators: `python -m benchmarks "
        f"llamacpp`); a fork within {bound:.3g} (twice what rounding moved a competing logit "
        "between one-row and multi-row forwards here) is a near-tie, beyond it a bug"
    )
    if cost is not None:
        print(f"# verify cost at start-up, {cost.describe(128)}")
    fields = {
        "engine": "llamacpp",
        "model": str(tree.path),
        "threads": tree.threads,
        "max_new_tokens": args.max_new_tokens,
        "budget": args.budget,
        "max_budget": args.max_budget,
        "depth": args.depth,
        "multi_branch": not args.single_branch,
        "cpu_features": features,
        "rounding_bound": bound,
        "start_up_costs": cost.to_json() if cost is not None else None,
    }
    rows = run(plain, gen, prompts, encoded, args.max_new_tokens, bound)
    rc = show(rows, len(prompts), args, label, fields, bound)
    learned = getattr(gen.sizer, "learned", None)
    if learned is not None:
        print(
            f"# verify cost learnt from this run's forwards, {learned.as_cost_model().describe(128)}"
        )
    plain.close()
    return rc
