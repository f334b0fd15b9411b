"""Same-process A/B of two builds of the Rust core, next to vLLM's bare n-gram scan.

    python -m research.host_ab OLD/_core.abi3.so NEW/_core.abi3.so [CTX] [ROUNDS] [--history]
    python -m research.host_ab OLD/_core.abi3.so NEW/_core.abi3.so --drafts [ROUNDS]
    python -m research.host_ab OLD/_core.abi3.so NEW/_core.abi3.so --rows [ROUNDS]

Build each version (`cargo build --release --features python --manifest-path
rust/Cargo.toml`, then copy `target/release/liblookahead_core.so` somewhere; never over the
`_core.abi3.so` a running process has loaded). One process loads both builds side by side and
times our whole step (`Cache.step`: extend one verified token + budget-16 tree draft) on the
same 16 requests with CTX-token prompts (default 1,000), and vLLM's scan (min 5 / max 5, and
min 1 / max 5) over the same contexts, in rounds of 1,600 steps whose order rotates, so drift
of this VM's speed hits every variant alike. Prints the median over rounds of each mean, and
per-round ratios. `--history`: both caches first index the first half of the token stream as
history (58k tokens of Spec-Bench; the requests' prompts come from the second half), so
drafts also read a large shared history, as a server's do after a while; the scan reads only
the request's context, as it always does.

`--drafts`: drafts alone, as `python -m benchmarks trie` times them (`Cache._time_drafts`, timed
inside Rust): a history of 1M nodes (the Spec-Bench words, shifted copies), 64 requests
with 1k-token prompts, budget 8 / 16 / 32 trees and a 16-token chain; rounds of 5,000 drafts
alternate between the builds (default 10). Mean, p99 and thread-CPU mean per build (median
over rounds), and the median over rounds of the new/old ratio of each.

`--rows`: the other rows of BENCHMARKS.md §3, build against build in alternating order:
prompt indexing at 1k / 8k / 32k tokens (`_core._time_index`, the median of 5 per round),
history insert (ns per token filling a 1M-node history through `add_history`), and budget-16
drafts while another thread indexes 32k-token prompts into the same cache.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import threading
import time

import numpy as np
from lookahead import LookaheadCache

from benchmarks.harness import run_script
from benchmarks.peers.vllm_ngram import find_longest_matched_ngram
from benchmarks.traces import DEFAULT_QUESTIONS
from benchmarks.trie import (
    fill_history,
    spec_bench_texts,
    start_drafting_requests,
)


def _new_cache(m):
    """A cache of build `m` with the same settings whatever its constructor's age: depth 12,
    4M nodes, weights 4 / 1, no history skip, no recycling (the builds of early 2026-11-30 take
    the first seven arguments, later ones history_skip too, today's the recycle settings)."""
    args = (12, 4_000_000, 4.0, 1.0, False, False, 0)
    for more in ((None, 0, 0, 1.0), (None,), ()):
        try:
            return m.Cache(*args, *more)
        except TypeError:
            if not more:
                raise
    raise AssertionError("unreachable")


def _load(tag: str, path: str):
    name = f"{tag}._core"  # PyO3's init symbol is PyInit__core: the last component must match
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def drafts_ab(mods: dict, rounds: int) -> int:
    """`--drafts`: both builds' drafts on the same 1M-node history and 64 requests."""
    data = DEFAULT_QUESTIONS
    texts = spec_bench_texts(data)
    stream = np.concatenate(texts)
    caches = {}
    for k, m in mods.items():
        # As `python -m benchmarks trie` builds them, on each build's core.
        cache = LookaheadCache(_core_cache=_new_cache(m))
        fill_history(cache, texts, 1_000_000)
        rids = start_drafting_requests(cache, stream, 64, 1_000)
        caches[k] = cache._c
    for budget, multi in ((8, True), (16, True), (32, True), (16, False)):
        res = {k: {"mean": [], "p99": [], "cpu mean": []} for k in ("old", "new")}
        for rd in range(rounds):
            for k in ("old", "new") if rd % 2 == 0 else ("new", "old"):
                wall, cpu, _ = caches[k]._time_drafts(rids, budget, multi, 5000)
                res[k]["mean"].append(np.mean(wall) / 1e3)
                res[k]["p99"].append(np.percentile(wall, 99) / 1e3)
                res[k]["cpu mean"].append(np.mean(cpu) / 1e3)
        _report(f"draft budget {budget} {'tree' if multi else 'chain'}, µs", res, rounds)
    return 0


def _report(what: str, res: dict, rounds: int) -> None:
    """One line per statistic: each build's median over rounds and the new/old ratio."""
    for stat in res["old"]:
        old, new = np.array(res["old"][stat]), np.array(res["new"][stat])
        print(
            f"{what} {stat}: old {np.median(old):.2f} new {np.median(new):.2f}; new/old "
            f"{np.median(new / old):.3f} (new cheaper in {int((new < old).sum())}/{rounds} rounds)"
        )


def rows_ab(mods: dict, rounds: int) -> int:
    """`--rows`: indexing, history insert, and drafts while indexing, build against build."""
    texts = spec_bench_texts(DEFAULT_QUESTIONS)
    stream = np.concatenate(texts)
    order = lambda rd: ("old", "new") if rd % 2 == 0 else ("new", "old")  # noqa: E731
    for n in (1_000, 8_000, 32_000):
        prompt = np.ascontiguousarray(np.resize(stream, n), dtype=np.uint32)
        res = {k: {"ns/token": []} for k in mods}
        for rd in range(rounds):
            for k in order(rd):
                ns = sorted(mods[k]._time_index(prompt, 12)[0] for _ in range(5))[2]
                res[k]["ns/token"].append(ns / n)
        _report(f"index {n}-token prompt", res, rounds)
    res = {k: {"ns/token": []} for k in mods}
    caches = {}
    for rd in range(rounds):
        for k in order(rd):
            cache = LookaheadCache(_core_cache=_new_cache(mods[k]))
            t0 = time.perf_counter_ns()
            tokens = fill_history(cache, texts, 1_000_000)
            res[k]["ns/token"].append((time.perf_counter_ns() - t0) / tokens)
            caches[k] = cache
    _report("history insert to 1M nodes", res, rounds)
    prompt = np.ascontiguousarray(np.resize(stream[::-1], 32_000), dtype=np.uint32)
    res = {k: {"mean": [], "p99": []} for k in mods}
    rids = {k: start_drafting_requests(c, stream, 64, 1_000) for k, c in caches.items()}
    for rd in range(rounds):
        for k in order(rd):
            cache, stop = caches[k], threading.Event()

            def indexer(cache=cache, stop=stop):
                i = 0
                while not stop.is_set():
                    cache.start_request(f"bg-{i}", prompt)
                    cache.draft(f"bg-{i}", budget=1)  # waits until its prompt is indexed
                    cache.finish_request(f"bg-{i}")
                    i += 1

            th = threading.Thread(target=indexer, daemon=True)
            th.start()
            time.sleep(0.05)
            wall, _, _ = cache._c._time_drafts(rids[k], 16, True, 20_000)
            stop.set()
            th.join()
            res[k]["mean"].append(np.mean(wall) / 1e3)
            res[k]["p99"].append(np.percentile(wall, 99) / 1e3)
    _report("draft budget 16 tree while 32k prompts are indexed, µs", res, rounds)
    return 0


def main(argv: list[str]) -> int:
    history = "--history" in argv
    drafts = "--drafts" in argv
    rows = "--rows" in argv
    argv = [a for a in argv if a not in ("--history", "--drafts", "--rows")]
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    mods = {"old": _load("old", argv[0]), "new": _load("new", argv[1])}
    if drafts:
        return drafts_ab(mods, int(argv[2]) if len(argv) > 2 else 10)
    if rows:
        return rows_ab(mods, int(argv[2]) if len(argv) > 2 else 6)
    n = int(argv[2]) if len(argv) > 2 else 1000
    rounds = int(argv[3]) if len(argv) > 3 else 16
    n_req, per, budget = 16, 1600, 16
    data = DEFAULT_QUESTIONS
    stream = np.ascontiguousarray(np.concatenate(spec_bench_texts(data)), dtype=np.int32)
    steps = per * rounds // n_req + 2
    hist_end = stream.size // 2 if history else 0
    offs = np.random.default_rng(0).integers(
        hist_end, max(hist_end + 1, stream.size - n - steps - 1), n_req
    )
    nexts = [stream[o + n : o + n + steps].tolist() for o in offs]
    caches = {}
    for k, m in mods.items():
        # The defaults of `LookaheadCache`, background indexing off.
        c = _new_cache(m)
        if history:
            c.add_history([stream[:hist_end].tolist()], "default")
        for r, o in enumerate(offs):
            c.start_request(r, stream[o : o + n].tolist(), "default")
        caches[k] = c
    find_longest_matched_ngram(np.zeros(8, np.int32), 5, 5, 1 << 30, budget)  # numba JIT
    names = ["old", "new", "vllm5-5", "vllm1-5"]
    res = {k: [] for k in names}
    for rd in range(rounds):
        for k in names[rd % 4 :] + names[: rd % 4]:
            ns = np.empty(per, dtype=np.int64)
            for j in range(per):
                i = rd * per + j
                r, q = i % n_req, i // n_req
                if k in caches:
                    c, tok = caches[k], nexts[r][q : q + 1]
                    t0 = time.perf_counter_ns()
                    c.step(r, tok, budget, True)
                else:
                    ctx = stream[offs[r] : offs[r] + n + q]
                    lo = 5 if k == "vllm5-5" else 1
                    t0 = time.perf_counter_ns()
                    find_longest_matched_ngram(ctx, lo, 5, 1 << 30, budget)
                ns[j] = time.perf_counter_ns() - t0
            res[k].append(ns.mean() / 1e3)
    m = {k: np.array(v) for k, v in res.items()}
    print(
        f"ctx {n}{', history ' + str(hist_end) if history else ''}, {rounds} rounds x {per} steps; mean µs per step (median over rounds): "
        + "  ".join(f"{k} {np.median(v):.2f}" for k, v in m.items())
    )
    for k in ("old", "new"):
        print(
            f"  {k}: {np.median(m[k] / m['vllm5-5']):.2f}x vllm5-5, "
            f"{np.median(m[k] / m['vllm1-5']):.2f}x vllm1-5"
        )
    wins = int((m["new"] < m["old"]).sum())
    print(f"  new/old {np.median(m['new'] / m['old']):.3f} (new cheaper in {wins}/{rounds} rounds)")
    return 0


if __name__ == "__main__":
    run_script(main, __doc__)
