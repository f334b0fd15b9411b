"""Several Python threads start, extend, draft and finish requests on one cache at once.

The core releases the GIL, so these really run concurrently with background indexing and
eviction. Passing means: no crash, no deadlock (per-test timeout), no exception other than
the ones the API documents, and the invariants and the capacity bound hold afterwards.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from lookahead import LookaheadCache


@pytest.mark.timeout(180)
@pytest.mark.parametrize("capacity", [3_000, 1_000_000])
def test_threads_hammer_one_cache(capacity):
    cache = LookaheadCache(
        max_depth=6, capacity_nodes=capacity, background_indexing=True, index_threads=2
    )
    errors: list[BaseException] = []
    stop = threading.Event()

    def worker(w: int) -> None:
        rng = np.random.default_rng(w)
        try:
            for i in range(60):
                rid = f"{w}-{i}"
                ns = ["default", "a", "b"][i % 3]
                cache.start_request(
                    rid, rng.integers(0, 40, size=int(rng.integers(1, 600))), namespace=ns
                )
                for _ in range(int(rng.integers(1, 8))):
                    cache.extend(rid, rng.integers(0, 40, size=int(rng.integers(0, 6))))
                    d = cache.draft(rid, budget=int(rng.integers(1, 24)), multi_branch=bool(i % 2))
                    assert d.num_nodes >= 1 and (d.parents[1:] < np.arange(1, d.num_nodes)).all()
                cache.draft_batch([rid], budget=8)
                cache.finish_request(rid, keep_prompt=bool(rng.integers(0, 2)))
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    def side() -> None:
        rng = np.random.default_rng(99)
        try:
            while not stop.is_set():
                cache.add_history([rng.integers(0, 40, size=300)], namespace="a")
                cache.stats()
                cache.check_invariants()
                assert cache.stats()["nodes"] <= capacity
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(6)]
    helper = threading.Thread(target=side)
    for t in threads:
        t.start()
    helper.start()
    for t in threads:
        t.join()
    stop.set()
    helper.join()
    assert not errors, errors[:3]
    cache.check_invariants()
    s = cache.stats()
    assert s["live_requests"] == 0 and s["own_nodes"] == 0 and s["nodes"] <= capacity
    if capacity == 3_000:
        assert s["evicted_nodes"] > 0
