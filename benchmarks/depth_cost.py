"""Host cost and history size of `max_depth` choices on the traces (BENCHMARKS.md §2.1).

One cache per depth replays the traces under the simulator's protocol (multi-branch, budget
16); the caches take turns request by request in a rotating order, so a phase of this VM's
speed hits them alike. Prints each depth's draft + extend time per step and its history
nodes at the end.

    python benchmarks/depth_cost.py [DEPTHS] [TRACES]     # DEPTHS default: 8,10,12
"""

from __future__ import annotations

import sys
import time

import numpy as np
from lookahead import LookaheadCache
from lookahead.bench.accept import accepted_length
from lookahead.bench.traces import DEFAULT_OUT, read_traces


def main(argv: list[str]) -> int:
    depths = [int(x) for x in (argv[0] if argv else "8,10,12").split(",")]
    traces = read_traces(argv[1] if len(argv) > 1 else DEFAULT_OUT)
    caches = {d: LookaheadCache(background_indexing=False, max_depth=d) for d in depths}
    host: dict[int, list[float]] = {d: [] for d in depths}
    for rid, req in enumerate(traces):
        prompt = np.asarray(req["prompt_ids"], dtype=np.int32)
        output = np.asarray(req["output_ids"], dtype=np.int32)
        for depth in depths[rid % len(depths) :] + depths[: rid % len(depths)]:
            c = caches[depth]
            c.start_request(rid, prompt)
            c.extend(rid, output[:1])
            pos = 1
            while pos < len(output):
                t0 = time.perf_counter_ns()
                d = c.draft(rid, 16, True)
                t1 = time.perf_counter_ns()
                tokens, parents = d.tokens.tolist()[1:], [p - 1 for p in d.parents.tolist()[1:]]
                a = accepted_length(
                    tokens, parents, output[pos : pos + min(16, len(output) - pos - 1)]
                )
                t2 = time.perf_counter_ns()
                c.extend(rid, output[pos : pos + a + 1])
                host[depth].append((t1 - t0 + time.perf_counter_ns() - t2) / 1e3)
                pos += a + 1
            c.finish_request(rid)
    for depth in depths:
        v = np.array(host[depth])
        print(
            f"max_depth {depth}: draft + extend per step mean {v.mean():.2f} µs, p50 "
            f"{np.median(v):.2f}, p99 {np.percentile(v, 99):.2f}; {len(v)} steps; "
            f"{caches[depth].stats()['history_nodes']} history nodes"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
