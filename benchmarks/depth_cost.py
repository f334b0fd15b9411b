"""Host cost and history size of `max_depth` choices on the traces (BENCHMARKS.md §2.1).

One multi-branch drafter per depth replays the traces through the acceptance simulator
(`run_drafters`, budget 16: the drafters take turns request by request in a rotating order,
so a phase of this VM's speed hits them alike). Prints each depth's tokens per step, its
draft + extend time per step and its history nodes at the end.

    python benchmarks/depth_cost.py [DEPTHS] [TRACES]     # DEPTHS default: 8,10,12
"""

from __future__ import annotations

import sys

from lookahead.bench.accept import oracle_tables, run_drafters, summarize
from lookahead.bench.peers.ours import LookaheadDrafter
from lookahead.bench.traces import DEFAULT_OUT, read_traces


def main(argv: list[str]) -> int:
    depths = [int(x) for x in (argv[0] if argv else "8,10,12").split(",")]
    traces = read_traces(argv[1] if len(argv) > 1 else DEFAULT_OUT)
    drafters = [LookaheadDrafter(True, label=f"depth {d}", max_depth=d) for d in depths]
    rows = run_drafters(drafters, traces, oracle_tables(traces, 16), 16)
    for depth, drafter, r in zip(depths, drafters, rows):
        s = summarize(r)["overall"]
        print(
            f"max_depth {depth}: {s['al']:.3f} tokens per step; draft + extend per step mean "
            f"{s['host_us_mean']:.2f} µs, p99 {s['host_us_p99']:.2f}; {s['steps']} steps; "
            f"{drafter.cache.stats()['history_nodes']} history nodes"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
