"""Benchmarks: `python -m lookahead.bench NAME ...` or `lookahead bench NAME ...`.

Each benchmark is one module here with a `main(argv) -> int` function and a `--json FILE`
option that writes its full results.
"""

from __future__ import annotations

import importlib
import sys

BENCHES = {
    "trie": "lookahead.bench.trie",  # host cost of the trie (and peers with --peers)
    "accept": "lookahead.bench.accept",  # acceptance simulator over recorded traces
    "e2e": "lookahead.bench.e2e",  # end to end on CPU against plain decoding and PLD
    "traces": "lookahead.bench.traces",  # record prompt/output traces with the default model
    "plot": "lookahead.bench.plot",  # redraw a bench's chart from its --json file
}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark named by the first argument."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in BENCHES:
        names = ", ".join(BENCHES)
        print(f"usage: lookahead bench {{{names}}} [options]", file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module = importlib.import_module(BENCHES[argv[0]])
    return int(module.main(argv[1:]) or 0)
