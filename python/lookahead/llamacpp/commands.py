"""The `lookahead` command's `--engine llamacpp`: what of the arguments this engine takes,
its generator, and `calibrate` (arguments parsed by `lookahead.cli`)."""

from __future__ import annotations

import os


def engine_problem(args) -> str | None:
    """What the llama.cpp engine cannot do of `args` (checked before the model loads), or
    None: it runs a GGUF file as is, on the CPU, without recycling or a repetition penalty;
    the demo's llama-server peer must be a binary it can run, with a known setting."""
    if args.dtype != "auto":
        return "--dtype is the HF engine's: the llama.cpp engine runs the GGUF's own types"
    if args.device != "cpu":
        return "the llama.cpp engine runs on the CPU: leave --device out"
    if getattr(args, "recycle", "off") != "off":
        return "--recycle is not in the llama.cpp engine yet"
    if getattr(args, "repetition_penalty", None) not in (None, 1.0):
        return "--repetition-penalty is not in the llama.cpp engine yet"
    return peer_problem(args) if getattr(args, "command", None) == "demo" else None


def llama_server(args) -> tuple:
    """The demo's llama-server binary and where it was named (`--llama-server`, else
    `$LOOKAHEAD_LLAMA_SERVER`), or (None, None): no peer column."""
    from lookahead.llamacpp.server import ENV_BINARY

    if getattr(args, "llama_server", None) is not None:
        return args.llama_server, "--llama-server"
    if os.environ.get(ENV_BINARY):
        return os.environ[ENV_BINARY], f"${ENV_BINARY}"
    return None, None


def peer_problem(args) -> str | None:
    """What is wrong with the demo's llama-server peer (its binary, `--llama-spec`), or None."""
    from lookahead.llamacpp.server import SPECULATORS, binary_problem

    path, source = llama_server(args)
    spec = getattr(args, "llama_spec", None)
    if spec is not None and spec not in SPECULATORS:
        return f"--llama-spec must be one of {', '.join(SPECULATORS)}, got {spec[:40]!r}"
    if path is None:
        if spec is not None:
            return "--llama-spec needs a llama-server: --llama-server PATH (`make llama-server`)"
        return None
    return binary_problem(path, source)


def load(args, retime: bool = False):
    """The `LlamaCppModel` of `args.model` (default: the default model's GGUF, fetched once);
    `retime`: its flash-attention choice timed again, not read from an earlier load's."""
    from lookahead.llamacpp.model import DEFAULT_FLASH_ATTN, LlamaCppModel
    from lookahead.models import default_gguf_path

    path = args.model if args.model is not None else default_gguf_path()
    fa = getattr(args, "flash_attn", None) or DEFAULT_FLASH_ATTN
    return LlamaCppModel(path, n_threads=args.threads, flash_attn=fa, retime=retime)


def describe(model) -> str:
    """`llama.cpp, SmolLM2-135M-Instruct.Q4_1.gguf, 2 threads, flash attention on (chosen by
    timing at load)` (or `at an earlier load`)."""
    c = model.flash_choice
    how = ""
    if c is not None:
        how = f" (chosen by timing at {'an earlier load' if c.kept else 'load'})"
    return (
        f"llama.cpp, {model.path.name}, {model.threads} threads, flash attention "
        f"{model.flash_attn}{how}"
    )


def generator(args):
    """The engine's generator from `args`, and what the statistics line says of it."""
    from lookahead.llamacpp.generator import LlamaCppGenerator

    model = load(args)
    gen = LlamaCppGenerator(
        model,
        budget=args.budget,
        max_budget=args.max_budget,
        min_draft_score=args.min_draft_score,
        depth=args.depth,
        multi_branch=not args.single_branch,
    )
    return gen, describe(model)


def calibrate(args) -> int:
    """`lookahead calibrate --engine llamacpp`: the flash-attention setting and the verify
    cost by rows, measured now and kept for later loads of the same file on this machine
    (the engine reads both from there, or measures them at a first load)."""
    from lookahead.costs import load_or_measure

    model = load(args, retime=True)
    costs = load_or_measure(model, refresh=True)
    if model.flash_choice is not None:
        print(model.flash_choice.describe())
    print(f"verify cost by rows ({describe(model)})")
    print(costs.describe(128))
    return 0
