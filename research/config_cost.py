"""Host cost and history size of cache configurations on the traces (research/README.md).

One multi-branch drafter per configuration replays the traces through the acceptance
simulator (`run_drafters`, budget 16: the drafters take turns request by request in a
rotating order, so a phase of this VM's speed hits them alike). Prints each one's tokens per
step, its draft + extend time per step and its history nodes at the end. A configuration is
`LookaheadCache` keyword arguments, as Python literals:

    python -m research.config_cost [--traces FILE] CONFIG [CONFIG ...]
    python -m research.config_cost max_depth=8 max_depth=10 max_depth=12
    python -m research.config_cost history_skip=None 'history_skip=(3,6)'
"""

from __future__ import annotations

from benchmarks.accept import oracle_tables, run_drafters, summarize
from benchmarks.harness import parse_kwargs, run_script
from benchmarks.peers.ours import OursDrafter
from benchmarks.traces import DEFAULT_OUT, read_traces


def main(argv: list[str]) -> int:
    path = DEFAULT_OUT
    if argv[:1] == ["--traces"]:
        path, argv = argv[1], argv[2:]
    if not argv:
        print(__doc__)
        return 2
    traces = read_traces(path)
    drafters = [OursDrafter(True, label=spec, **parse_kwargs(spec)) for spec in argv]
    rows = run_drafters(drafters, traces, oracle_tables(traces, 16), 16)
    for spec, drafter, r in zip(argv, drafters, rows):
        s = summarize(r)["overall"]
        print(
            f"{spec}: {s['al']:.3f} tokens per step; draft + extend per step mean "
            f"{s['host_us_mean']:.2f} µs, p99 {s['host_us_p99']:.2f}; {s['steps']} steps; "
            f"{drafter.cache.stats()['history_nodes']} history nodes"
        )
    return 0


if __name__ == "__main__":
    run_script(main, __doc__)
