"""Benchmarks of lookahead against its peers: `python -m benchmarks NAME ...` from a clone.

Not part of the installed package: they import the peers (SGLang's n-gram corpus,
SuffixDecoding, vLLM's proposer, HF prompt lookup) that `make dev` installs. Each benchmark
is one module here with a `main(argv) -> int` function and a `--json FILE` option that
writes its full results; the scripts beside them run as `python -m benchmarks.NAME`.
"""

from __future__ import annotations

import importlib
import sys

BENCHES = {
    "trie": ("benchmarks.trie", "host cost of the trie (and of the peers' with --peers)"),
    "accept": ("benchmarks.accept", "acceptance simulator over the recorded traces"),
    "e2e": ("benchmarks.e2e", "end to end against plain decoding and HF prompt lookup"),
    "traces": ("benchmarks.traces", "record prompt/output traces with the default model"),
    "llamacpp": ("benchmarks.llamacpp", "llama.cpp: plain, its n-gram speculators, lookahead"),
    "plot": ("benchmarks.plot", "redraw a bench's PNG chart from its --json file"),
}


def _usage() -> str:
    lines = [f"usage: python -m benchmarks {{{','.join(BENCHES)}}} [options]", ""]
    lines += [f"  {name:<8} {desc}" for name, (_, desc) in BENCHES.items()]
    lines += ["", "python -m benchmarks NAME --help: the options of one benchmark"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark named by the first argument."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage(), file=sys.stderr)
        return 0 if argv else 2
    if argv[0] not in BENCHES:
        print(f"python -m benchmarks: unknown benchmark {argv[0]!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(BENCHES[argv[0]][0])
    from lookahead.errors import LookaheadError

    try:
        return int(module.main(argv[1:]) or 0)
    except KeyboardInterrupt:
        print(f"\npython -m benchmarks {argv[0]}: interrupted", file=sys.stderr)
        return 130
    except (LookaheadError, ValueError, OSError) as e:
        # What a user can fix (a path, a file's contents, a model, a value): one line.
        print(f"python -m benchmarks {argv[0]}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
