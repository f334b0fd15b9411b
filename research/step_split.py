"""Where a simulator step's host time goes: our draft and extend timed apart (research/README.md).

    python -m research.step_split [TRACES]

Replays the traces through the acceptance simulator (`run_drafters`, B = 16: ours multi and
vLLM's 5/5 scan taking turns request by request) with each drafter's `draft` and `extend`
calls timed separately, then times `extend` alone through the API on one request: no token
(the call), one token whose n-grams all exist (a repeating text), one whose deep n-grams are
new (random tokens).
"""

from __future__ import annotations

import time

import numpy as np
from lookahead import LookaheadCache

from benchmarks.accept import oracle_tables, run_drafters, summarize
from benchmarks.harness import run_script
from benchmarks.peers.ours import OursDrafter
from benchmarks.peers.vllm_ngram import VllmNgramDrafter
from benchmarks.traces import DEFAULT_OUT, read_traces


class Timed:
    """A drafter whose `draft` and `extend` calls are timed apart."""

    def __init__(self, drafter):
        self.d, self.name, self.draft_ns, self.extend_ns = drafter, drafter.name, [], []

    def start_request(self, rid, prompt):
        self.d.start_request(rid, prompt)

    def draft(self, rid, context, budget):
        t = time.perf_counter_ns()
        out = self.d.draft(rid, context, budget)
        self.draft_ns.append(time.perf_counter_ns() - t)
        return out

    def extend(self, rid, context, new_tokens):
        t = time.perf_counter_ns()
        self.d.extend(rid, context, new_tokens)
        self.extend_ns.append(time.perf_counter_ns() - t)

    def finish_request(self, rid):
        self.d.finish_request(rid)


def extend_alone(n: int = 20_000) -> None:
    """`extend` of 0 / 1 token through the API, mean µs over `n` calls."""
    rng = np.random.default_rng(0)
    cache = LookaheadCache(background_indexing=False)
    cache.start_request(0, rng.integers(0, 1000, 1000))
    loop = np.tile(rng.integers(0, 1000, 50).astype(np.int32), n // 50 + 2)
    fresh = rng.integers(0, 1000, n + 1).astype(np.int32)
    cases = {
        "no token (the call)": [np.zeros(0, np.int32)] * n,
        "1 token, its n-grams all seen (a 50-token loop)": [loop[i : i + 1] for i in range(n)],
        "1 token, its deep n-grams new (random tokens)": [fresh[i : i + 1] for i in range(n)],
    }
    for label, args in cases.items():
        t = time.perf_counter_ns()
        for a in args:
            cache.extend(0, a)
        print(f"extend alone, {label}: {(time.perf_counter_ns() - t) / n / 1e3:.2f} µs")


def main(argv: list[str]) -> int:
    traces = read_traces(argv[0] if argv else DEFAULT_OUT)
    drafters = [Timed(OursDrafter(True)), Timed(VllmNgramDrafter())]
    rows = run_drafters(drafters, traces, oracle_tables(traces, 16), 16)
    for d, r in zip(drafters, rows):
        s = summarize(r)["overall"]
        dr, ex = np.array(d.draft_ns) / 1e3, np.array(d.extend_ns) / 1e3
        print(
            f"{d.name}: {s['al']:.3f} tokens per step, step {s['host_us_mean']:.2f} µs mean; "
            f"draft mean {dr.mean():.2f} p50 {np.median(dr):.2f}; extend mean {ex.mean():.2f} "
            f"p50 {np.median(ex):.2f} µs"
        )
    extend_alone()
    return 0


if __name__ == "__main__":
    run_script(main, __doc__)
