"""How long `LookaheadCache.save` holds up a request's steps (the number in its docstring).

A 400k-token history (max_depth 8, ~2.8M nodes) is built; one thread runs `step` on a request
of the same namespace every millisecond (a decoding step of a fast server) while the main
thread saves; prints the save's time and the step latency before the save and its maximum
once the save started. (A step during a save leaves its tokens for the history to a later
step, up to 4,096 per request; a loop without pauses passes that bound within a save and
then waits.)

    python -m benchmarks.save_stall
"""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time

import numpy as np
from lookahead import LookaheadCache

from benchmarks.harness import run_script


def main(argv: list[str]) -> int:
    cache = LookaheadCache(max_depth=8, capacity_nodes=3_000_000, background_indexing=False)
    rng = np.random.default_rng(0)
    cache.add_history([rng.integers(0, 5000, size=400_000)])
    print(f"history nodes: {cache.stats()['history_nodes']}")
    cache.start_request("r", rng.integers(0, 5000, size=100))
    lat: list[float] = []
    stop = threading.Event()

    def steps():
        while not stop.is_set():
            t = time.perf_counter()
            cache.step("r", [int(rng.integers(0, 5000))], 8, True)
            lat.append(time.perf_counter() - t)
            time.sleep(0.001)

    th = threading.Thread(target=steps)
    th.start()
    time.sleep(0.5)
    n0 = len(lat)
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        cache.save(os.path.join(tmp, "h.bin"))
        saved = time.perf_counter() - t
    time.sleep(0.2)
    stop.set()
    th.join()
    before = sorted(lat[:n0])
    print(
        f"save {saved * 1e3:.0f} ms; step latency before it: median "
        f"{statistics.median(before) * 1e3:.3f} ms, p99 {before[int(0.99 * n0)] * 1e3:.2f} ms; "
        f"longest step once it started: {max(lat[n0:]) * 1e3:.1f} ms"
    )
    return 0


if __name__ == "__main__":
    run_script(main, __doc__)
