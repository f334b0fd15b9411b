"""`lookahead demo --engine llamacpp`: plain llama.cpp greedy decoding, llama.cpp's own n-gram
speculator and lookahead on llama.cpp, on the demo's prompts, in the HF demo's table
(`lookahead.demo_table.show`).

Plain decoding runs in a context of one sequence, one token per `llama_decode`, as llama.cpp
decodes without speculation; lookahead runs in the engine's own context. llama.cpp's n-gram
speculators live only in its `llama-server` binary: with `--llama-server PATH` one runs the
same GGUF with the same threads and context (`lookahead.llamacpp.server`, a setting of its
`SETTINGS`), and is the table's peer column, timed by its own prompt and decode timings.
Per prompt the methods run back to back, in an order rotated from prompt to prompt. An
output that differs from plain's is explained (`lookahead.llamacpp.forks`): a near-tie
within what this CPU's kernels move a logit between one-row and multi-row forwards, or a
bug (exit 1 when it is lookahead's).
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time

from lookahead.demo_table import DemoRow, Peer

WARM_UP = "Say hello."


def run(plain, gen, prompts, encoded, max_new_tokens: int, bound: float, server=None):
    """Yields a `DemoRow` per prompt (plain: `plain_generate` on `plain`, a one-sequence
    context of the same GGUF; lookahead: `gen`; the peer: `server`, a ready
    `lookahead.llamacpp.server.Server`, or None)."""
    from lookahead.llamacpp.forks import explain_fork
    from lookahead.llamacpp.generator import plain_generate

    methods = ("plain", "peer", "lookahead") if server is not None else ("plain", "lookahead")
    for k, (p, ids) in enumerate(zip(prompts, encoded)):
        out = {}
        for m in methods[k % len(methods) :] + methods[: k % len(methods)]:
            t0 = time.perf_counter()
            if m == "plain":
                t: dict = {}
                toks = plain_generate(plain, ids, max_new_tokens, times=t)
                out[m] = (toks, time.perf_counter() - t0, t["prefill_s"])
            elif m == "peer":
                out[m] = server.run(ids, max_new_tokens)  # its own timings, prompt included
            else:
                out[m] = gen.generate(ids, max_new_tokens)
        plain_ids, plain_s, plain_prefill_s = out["plain"]
        res = out["lookahead"]
        peer = None
        if "peer" in out:
            peer_ids, peer_s = out["peer"]
            peer = (peer_ids, peer_s, explain_fork(plain, ids, plain_ids, peer_ids, bound))
        fork = explain_fork(plain, ids, plain_ids, res.ids, bound)
        yield DemoRow.of(p, ids, plain_ids, plain_s, res, fork, peer, plain_prefill_s)


def main(args, prompts: list) -> int:
    """`lookahead demo --engine llamacpp` (arguments checked by `lookahead.cli`); the
    llama-server, if any, is stopped however the demo ends."""
    from lookahead.llamacpp.commands import generator
    from lookahead.llamacpp.model import LlamaCppModel

    t0 = time.perf_counter()
    gen, label = generator(args)
    tree = gen.model
    plain = server = None
    try:
        plain = LlamaCppModel(
            tree.path, tree.n_ctx, args.threads, n_seq_max=1, flash_attn=tree.flash_attn
        )
        server, spec = _start_server(args, tree)
        return _demo(args, prompts, gen, label, plain, server, spec, t0)
    finally:
        if server is not None:
            server.close()
        if plain is not None:
            plain.close()


def _start_server(args, tree) -> tuple:
    """The llama-server `args` name, started on `tree`'s GGUF, threads and context (not yet
    ready), and its setting; (None, None) when none is named."""
    from lookahead.llamacpp.commands import llama_server
    from lookahead.llamacpp.server import DEFAULT_SPECULATOR, SETTINGS, Server

    binary, _ = llama_server(args)
    if binary is None:
        return None, None
    spec = getattr(args, "llama_spec", None) or DEFAULT_SPECULATOR
    server = Server(
        binary, tree.path, SETTINGS[spec], tree.threads, tree.n_ctx, flash_attn=tree.flash_attn
    )
    return server, spec


def _demo(args, prompts, gen, label, plain, server, spec, t0) -> int:
    from lookahead.demo_table import show
    from lookahead.errors import InvalidInput
    from lookahead.llamacpp.forks import rounding_bound
    from lookahead.llamacpp.generator import check_request
    from lookahead.llamacpp.server import SETTINGS
    from lookahead.models import cpu_features

    tree = gen.model
    encoded = [tree.encode(p["turns"][0], chat=True) for p in prompts]
    for p, ids in zip(prompts, encoded):  # refused before any prompt runs
        try:
            check_request(tree, ids, args.max_new_tokens)
        except ValueError as e:
            raise InvalidInput(f"prompt {p['question_id']} ({p['category']}): {e}") from None
    warm = tree.encode(WARM_UP, chat=True)
    if server is not None:
        # Ready first: a server still loading takes the cores from the engine's warm-up,
        # whose forwards the sizer learns from (one-row forwards read 20x dear, measured).
        server.wait_ready()
        server.complete(warm, 4)
    gen.generate(warm, 4)  # warm-up
    bound = rounding_bound(plain, tree, encoded[0])
    print(
        f"model {tree.path} loaded, start-up cost curve read or measured"
        + (f", llama-server ({spec}) ready" if server is not None else "")
        + f" in {time.perf_counter() - t0:.1f}s; {len(prompts)} prompts, max "
        f"{args.max_new_tokens} new tokens",
        file=sys.stderr,
    )
    features = cpu_features()
    cost = gen.cost_model
    if server is not None:
        methods = (
            f"plain llama.cpp greedy decoding, llama.cpp's n-gram speculator (ngram: "
            f"llama-server {' '.join(SETTINGS[spec])}, its own timings) and lookahead"
        )
    else:
        methods = (
            "plain llama.cpp greedy decoding and lookahead (llama.cpp's n-gram speculator as a "
            "column: --llama-server PATH, built by `make llama-server`)"
        )
    print(
        f"# {label} (CPU: {', '.join(features) or 'no AVX2'}); tok/s of {methods}; a fork "
        f"within {bound:.3g} (twice what rounding moved a competing logit between one-row and "
        "multi-row forwards here) is a near-tie, beyond it a bug"
    )
    if tree.flash_choice is not None:
        print(f"# {tree.flash_choice.describe()}")
    if cost is not None:
        print(f"# verify cost at start-up, {cost.describe(128)}")
    fields = {
        "engine": "llamacpp",
        "model": str(tree.path),
        "threads": tree.threads,
        "flash_attn": tree.flash_attn,
        "flash_choice": dataclasses.asdict(tree.flash_choice) if tree.flash_choice else None,
        "max_new_tokens": args.max_new_tokens,
        "budget": args.budget,
        "max_budget": args.max_budget,
        "depth": args.depth,
        "multi_branch": not args.single_branch,
        "cpu_features": features,
        "rounding_bound": bound,
        "start_up_costs": cost.to_json() if cost is not None else None,
        "llama_server": str(server.binary) if server is not None else None,
        "llama_spec": spec,
        "llama_spec_args": SETTINGS[spec] if server is not None else None,
    }
    peer = Peer("ngram", f"llama-server {spec}") if server is not None else None
    rows = run(plain, gen, prompts, encoded, args.max_new_tokens, bound, server)
    rc = show(rows, len(prompts), args, label, fields, bound, peer)
    learned = getattr(gen.sizer, "learned", None)
    if learned is not None:
        # Read where the demo drafted (its prompts' median length), not at the start-up
        # line's 128 tokens: that band saw only the warm-up's forwards.
        at = int(statistics.median(len(ids) for ids in encoded))
        print(f"# verify cost learnt from this run's forwards, {learned.describe(at)}")
    return rc
