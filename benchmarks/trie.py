"""`python -m benchmarks trie`: host cost of the trie (indexing, drafting, memory).

Measures, on this machine:
- prompt indexing of 1k / 8k / 32k-token prompts at depth 12: ns per token, in the core
  (`_core._time_index`: the sorted build of one own trie) and through the API
  (`start_request` with `background_indexing=False`: validation, copy, budget, build);
- drafts at budgets 8 / 16 / 32 (best-first trees, and one branch at 16) on a shared history
  of about 1M nodes: µs mean / p50 / p99, timed inside Rust (`Cache._time_drafts`, no Python
  in the loop) and through `LookaheadCache.draft` (what a Python caller pays);
- the same budget-16 drafts while another thread indexes 32k-token prompts without pause;
- for core timings also thread-CPU time per call (the cost without preemption: on a shared,
  oversubscribed machine wall-clock tails mostly measure the scheduler);
- bytes per stored node and per indexed prompt token;
- many tenants: requests spread over 1 / 1k / 20k namespaces at a fixed capacity, each run in
  a fresh child process: RSS growth, `stats()["bytes"]` per capacity node, µs per request
  (start + extend + draft + finish; mean and p99, the p99 being where eviction runs), and
  what one compaction of a shrunk history costs (`_core._time_compaction`: one pass under
  that namespace's write lock), and the steps of its requests while it runs
  (`Cache._time_compaction_stall`: built beside the history; in place, and none, to compare);
- with `--peers`, next to the peers' rows: our cost per decoding step through the Python API
  (`extend` + `draft`, and the fused `step`) at 1k / 8k / 32k-token contexts, beside vLLM's
  n-gram scan over the same contexts (`benchmarks.peers.hostcost`).

Data: the Spec-Bench questions (`--data`, default `benchmarks.traces.default_questions()`:
$LOOKAHEAD_SPEC_BENCH, the workplace's shared question.jsonl, else the packaged sample) tokenized crudely (words and punctuation, ids by first appearance),
or `--data zipf`: a Zipf(1.1) stream over 32k ids with repeated phrases. Drafting requests
take 1k-token slices of the same text as prompts, so their contexts occur in the history
(a copy-heavy load: drafts fill the budget, the slow case).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time
from pathlib import Path

import numpy as np
from lookahead import LookaheadCache, _core
from lookahead.output import check_outputs, command_line, header, write_json

from benchmarks.harness import positive_int
from benchmarks.traces import DEFAULT_QUESTIONS


def spec_bench_texts(path: Path) -> list[np.ndarray]:
    """Every turn of every question as crude word/punctuation token ids."""
    vocab: dict[str, int] = {}
    texts = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            for turn in json.loads(line).get("turns", []):
                words = re.findall(r"\w+|[^\w\s]", turn)
                texts.append(
                    np.array([vocab.setdefault(w, len(vocab)) for w in words], dtype=np.uint32)
                )
    return [t for t in texts if t.size]


def zipf_texts(n_tokens: int, seed: int = 0, vocab: int = 32_000) -> list[np.ndarray]:
    """Zipf(1.1) token ids with repeated phrases (a quarter of each text copies earlier text)."""
    rng = np.random.default_rng(seed)
    texts, made = [], 0
    while made < n_tokens:
        t = (rng.zipf(1.1, size=600) % vocab).astype(np.uint32)
        for _ in range(5):
            a, n = rng.integers(0, 500), rng.integers(10, 40)
            b = rng.integers(0, 600 - n)
            t[b : b + n] = t[a : a + n]
        texts.append(t)
        made += t.size
    return texts


def stats_us(ns: np.ndarray) -> dict[str, float]:
    us = np.asarray(ns, dtype=np.float64) / 1e3
    return {
        "mean": float(us.mean()),
        "p50": float(np.percentile(us, 50)),
        "p90": float(np.percentile(us, 90)),
        "p99": float(np.percentile(us, 99)),
    }


def cpu_stats(ns: np.ndarray) -> dict[str, float]:
    """Thread-CPU time per call: the cost without the time a busy machine preempted us."""
    return {f"cpu_{k}": v for k, v in stats_us(ns).items()}


def bench_insert(stream: np.ndarray, depth: int, sizes: list[int], reps: int) -> list[dict]:
    rows = []
    for n in sizes:
        prompt = np.ascontiguousarray(np.resize(stream, n), dtype=np.uint32)
        wall, cpu, nodes, nbytes = [], [], 0, 0
        for _ in range(reps):
            c0 = time.thread_time_ns()
            ns, nodes, nbytes = _core._time_index(prompt, depth)
            cpu.append(time.thread_time_ns() - c0)
            wall.append(ns)
        cache = LookaheadCache(max_depth=depth, capacity_nodes=8_000_000, background_indexing=False)
        api = []
        for r in range(reps):
            t0 = time.perf_counter_ns()
            cache.start_request(r, prompt)
            api.append(time.perf_counter_ns() - t0)
            cache.finish_request(r)
        med = float(np.median(wall))
        rows += [
            {"what": "index_prompt", "path": "core", "size": n, "unit": "ms", "p50": med / 1e6,
             "min": min(wall) / 1e6, "cpu_p50": float(np.median(cpu)) / 1e6, "ns_per_token": med / n,
             "nodes": nodes, "bytes_per_node": nbytes / nodes, "bytes_per_token": nbytes / n},
            {"what": "index_prompt", "path": "api", "size": n, "unit": "ms",
             "p50": float(np.median(api)) / 1e6, "min": min(api) / 1e6,
             "ns_per_token": float(np.median(api)) / n},
        ]  # fmt: skip
    return rows


def fill_history(cache, texts: list[np.ndarray], target_nodes: int) -> int:
    """Adds `texts` to `cache`'s history until it holds `target_nodes`; returns the tokens."""
    shift, tokens = 0, 0
    while cache.stats()["history_nodes"] < target_nodes:
        # Later passes shift ids so they add new n-grams instead of recounting old ones.
        for t in texts:
            cache.add_history([t + np.uint32(shift)])
            tokens += t.size
            if cache.stats()["history_nodes"] >= target_nodes:
                break
        shift += 1_000_000
    return tokens


def build_history(
    texts: list[np.ndarray], depth: int, target_nodes: int
) -> tuple[LookaheadCache, dict]:
    cache = LookaheadCache(max_depth=depth, capacity_nodes=max(4_000_000, 2 * target_nodes))
    t0 = time.perf_counter_ns()
    tokens = fill_history(cache, texts, target_nodes)
    el = time.perf_counter_ns() - t0
    s = cache.stats()
    return cache, {"what": "add_history", "path": "api", "size": s["history_nodes"], "unit": "ns/token",
                   "p50": el / tokens, "tokens": tokens, "bytes_per_node": s["bytes"] / s["history_nodes"]}  # fmt: skip


def start_drafting_requests(cache, stream, n_req, prompt_len, seed=0) -> list[int]:
    rng = np.random.default_rng(seed)
    rids = []
    for i in range(n_req):
        off = int(rng.integers(0, stream.size - prompt_len - 64))
        rid = 1_000_000 + i
        cache.start_request(rid, stream[off : off + prompt_len])
        cache.extend(rid, stream[off + prompt_len : off + prompt_len + 16])
        rids.append(rid)
    return rids


def bench_draft(cache, rids, budgets, iters) -> list[dict]:
    rows = []
    for budget, multi in [(b, True) for b in budgets] + [(16, False)]:
        wall, cpu, size = cache._c._time_drafts(rids, budget, multi, iters)
        rows.append({"what": "draft", "path": "core", "size": budget, "multi_branch": multi,
                     "unit": "us", **stats_us(wall), **cpu_stats(cpu), "mean_nodes": size})  # fmt: skip
        py = np.empty(min(iters, 20_000), dtype=np.int64)
        for i in range(py.size):
            rid = rids[i % len(rids)]
            t0 = time.perf_counter_ns()
            cache.draft(rid, budget=budget, multi_branch=multi)
            py[i] = time.perf_counter_ns() - t0
        rows.append({"what": "draft", "path": "api", "size": budget, "multi_branch": multi,
                     "unit": "us", **stats_us(py)})  # fmt: skip
    return rows


def bench_concurrent(cache, rids, stream, iters, prompt_len=32_000) -> dict:
    stop = threading.Event()
    indexed = [0]
    prompt = np.ascontiguousarray(np.resize(stream[::-1], prompt_len), dtype=np.uint32)

    def indexer():
        i = 0
        while not stop.is_set():
            rid = f"bg-{i}"
            cache.start_request(rid, prompt)
            cache.draft(rid, budget=1)  # waits until its prompt is indexed
            cache.finish_request(rid)
            indexed[0] += 1
            i += 1

    th = threading.Thread(target=indexer, daemon=True)
    th.start()
    time.sleep(0.05)
    t0 = time.perf_counter()
    wall, cpu, size = cache._c._time_drafts(rids, 16, True, iters)
    el = time.perf_counter() - t0
    stop.set()
    th.join()
    return {"what": "draft_while_indexing", "path": "core", "size": 16, "multi_branch": True,
            "unit": "us", **stats_us(wall), **cpu_stats(cpu), "mean_nodes": size,
            "prompts_indexed_per_s": indexed[0] / el}  # fmt: skip


TENANTS_CHILD = """
import json, sys, time
import numpy as np
from lookahead import LookaheadCache

def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) * 1024

names, requests, capacity = map(int, sys.argv[1:4])
c = LookaheadCache(capacity_nodes=capacity, background_indexing=False)
rng = np.random.default_rng(0)
prompts = rng.integers(0, 32000, size=(requests, 64))
outs = rng.integers(0, 32000, size=(requests, 32))
r0 = rss()
ns = np.empty(requests, dtype=np.int64)
worst = 0
for i in range(requests):
    t = time.perf_counter_ns()
    c.start_request(i, prompts[i], namespace=f"t-{i % names}")
    c.extend(i, outs[i])
    c.draft(i, budget=8)
    c.finish_request(i)
    ns[i] = time.perf_counter_ns() - t
    if i % 1000 == 0:
        worst = max(worst, c.stats()["bytes"])
s = c.stats()
rss_growth = rss() - r0
c.check_invariants()
print(json.dumps({"rss": rss_growth, "worst_bytes": worst, "stats": s, "us": (ns / 1e3).tolist()}))
"""


def run_tenants(names: int, requests: int, capacity: int, timeout: float = 1800) -> dict:
    """One many-tenants loop (request i in namespace `t-{i % names}`) in a fresh child
    process: its RSS growth, the largest `stats()["bytes"]` seen, the final stats, and µs
    per request for every request (the cache's invariants are checked after the loop)."""
    import subprocess

    out = subprocess.run(
        [sys.executable, "-c", TENANTS_CHILD, str(names), str(requests), str(capacity)],
        capture_output=True, text=True, check=True, timeout=timeout,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_compaction(tokens: int, depth: int = 12, reps: int = 3) -> dict:
    """One history of `tokens` random ids evicted to half its slots, then compacted: ms
    (median of `reps`) and ns per slot."""
    text = np.random.default_rng(0).integers(0, 32_000, size=tokens).astype(np.uint32)
    runs = [_core._time_compaction(text, depth) for _ in range(reps)]
    ns = sorted(r[0] for r in runs)[len(runs) // 2]
    slots, live = runs[0][1], runs[0][2]
    return {"what": "compaction", "path": "core", "size": slots, "live": live,
            "ms": ns / 1e6, "ns_per_slot": ns / slots}  # fmt: skip


def bench_compaction_stall(texts, stream, depth: int, nodes: int, reps: int = 2) -> list[dict]:
    """Steps of 16 requests (prompts indexed) while their namespace's history (`nodes`, swept
    to half its slots) is compacted on another thread: p50, p99 and the longest step, with
    the compaction built beside the history (today's), in place under its write lock
    (before 2026-12-03), and with none (40 ms of the same steps on the swept history), fresh
    caches in a rotating order, `reps` times each."""
    modes = ["beside", "in place", "none"]
    rows = []
    for rep in range(reps):
        for mode in modes[rep % 3 :] + modes[: rep % 3]:
            cache, _ = build_history(texts, depth, nodes)
            rids = start_drafting_requests(cache, stream, 16, 1_000, seed=rep)
            for rid in rids:
                cache.draft(rid, budget=1)  # waits until its prompt is indexed
            tokens = stream[:4096].tolist()
            ns, slots, live, steps = cache._c._time_compaction_stall("default", rids, tokens, 16, mode)  # fmt: skip
            us = np.asarray(steps, dtype=np.float64) / 1e3
            # (A small history's compaction may end before any step does: no figures then.)
            pct = {k: float(np.percentile(us, q)) if us.size else None
                   for k, q in (("p50", 50), ("p99", 99), ("max", 100))}  # fmt: skip
            rows.append({"what": "compaction_stall", "path": mode, "size": slots, "live": live,
                         "ms": ns / 1e6, "steps": int(us.size), **pct, "unit": "us"})  # fmt: skip
            del cache
    return rows


def bench_tenants(requests: int, capacity: int, names=(1, 1_000, 20_000)) -> list[dict]:
    """`run_tenants` for each count of namespaces; µs over the loop's second half."""
    rows = []
    for n in names:
        r = run_tenants(n, requests, capacity)
        us = np.asarray(r["us"][requests // 2 :])
        st = r["stats"]
        rows.append({"what": "tenants", "path": "api", "size": n, "requests": requests,
                     "capacity_nodes": capacity, "rss_mb": r["rss"] / 2**20,
                     "bytes_per_capacity_node": r["worst_bytes"] / capacity,
                     "namespaces_held": st["namespaces"], "evicted_nodes": st["evicted_nodes"],
                     "mean": float(us.mean()), "p50": float(np.percentile(us, 50)),
                     "p99": float(np.percentile(us, 99)), "unit": "us"})  # fmt: skip
    return rows


def print_rows(rows: list[dict]) -> None:
    for r in rows:
        if r["what"] == "index_prompt":
            extra = (f"  cpu {r['cpu_p50']:.2f} ms  {r['nodes']} nodes  {r['bytes_per_node']:.1f} B/node"
                     f"  {r['bytes_per_token']:.0f} B/token") if r["path"] == "core" else ""  # fmt: skip
            print(f"index {r['size']:>6} tokens [{r['path']:4}]  {r['p50']:8.2f} ms p50  "
                  f"{r['ns_per_token']:7.0f} ns/token{extra}")  # fmt: skip
        elif r["what"] == "add_history":
            print(f"history {r['size']} nodes from {r['tokens']} tokens: {r['p50']:.0f} ns/token, "
                  f"{r['bytes_per_node']:.1f} B/node")  # fmt: skip
        elif r["what"].startswith(("draft", "step")):
            kind = "tree" if r["multi_branch"] else "chain"
            tail = f"  ({r['mean_nodes']:.1f} nodes)" if "mean_nodes" in r else ""
            if "cpu_mean" in r:
                tail += (
                    f"  cpu: mean {r['cpu_mean']:.2f} p50 {r['cpu_p50']:.2f} p99 {r['cpu_p99']:.2f}"
                )
            if "prompts_indexed_per_s" in r:
                tail += f"  [{r['prompts_indexed_per_s']:.1f} x 32k prompts/s indexed meanwhile]"
            print(f"{r['what']:<21} budget {r['size']:>2} {kind:5} [{r['path']:4}]  mean {r['mean']:7.2f}  "
                  f"p50 {r['p50']:7.2f}  p99 {r['p99']:8.2f} us{tail}")  # fmt: skip
        elif r["what"] == "tenants":
            print(f"tenants {r['size']:>6} namespaces  {r['requests']} requests at capacity "
                  f"{r['capacity_nodes']}: RSS +{r['rss_mb']:.1f} MB, "
                  f"{r['bytes_per_capacity_node']:.1f} B per capacity node, "
                  f"{r['namespaces_held']} held, {r['evicted_nodes']} evicted; per request "
                  f"mean {r['mean']:.1f} p50 {r['p50']:.1f} p99 {r['p99']:.1f} us")  # fmt: skip
        elif r["what"] == "compaction":
            print(f"compaction of a history of {r['size']} slots ({r['live']} live): "
                  f"{r['ms']:.1f} ms, {r['ns_per_slot']:.1f} ns/slot")  # fmt: skip
        elif r["what"] == "compaction_stall":
            us = (f"p50 {r['p50']:.1f} p99 {r['p99']:.1f} max {r['max']:.1f} us"
                  if r["steps"] else "none overlapped it")  # fmt: skip
            print(f"steps during a compaction [{r['path']:8}] of {r['size']} slots ({r['live']} live, "
                  f"{r['ms']:.1f} ms): {r['steps']} steps, {us}")  # fmt: skip
        elif r["what"].startswith("ratio"):
            print(f"{r['what']:<21} {r['path']:<24} median {r['median']:.2f}x over {r['rounds']} "
                  f"rounds (min {r['min']:.2f}x, max {r['max']:.2f}x)")  # fmt: skip
        else:
            print(r)


def peer_rows(texts, stream, args) -> list[dict]:
    """Hook for peers' trie costs: `benchmarks.peers.trie_rows(texts, stream, args)`
    returns rows in this module's format."""
    from benchmarks import peers

    fn = getattr(peers, "trie_rows", None)
    if fn is None:
        raise SystemExit("--peers: benchmarks.peers has no trie_rows(texts, stream, args) yet")
    return list(fn(texts, stream, args))


def main(argv: list[str] | None = None) -> int:
    """Run the trie benchmark; print a table, optionally write rows to --json."""
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks trie", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--data", default=None, help="Spec-Bench question.jsonl, or 'zipf'")
    ap.add_argument("--depth", type=positive_int, default=12, help="our trie's max_depth")
    ap.add_argument(
        "--history-nodes", type=positive_int, help="shared-history size (1,000,000; quick: 50,000)"
    )
    ap.add_argument(
        "--iters", type=positive_int, help="drafts per configuration (50,000; quick: 2,000)"
    )
    ap.add_argument("--reps", type=positive_int, help="repetitions per prompt size (7; quick: 2)")
    ap.add_argument(
        "--quick", action="store_true", help="small sizes (a smoke run); explicit sizes still win"
    )
    ap.add_argument("--peers", action="store_true", help="also measure peer tries (hook)")
    ap.add_argument(
        "--tenants-only", action="store_true", help="only the many-tenants rows (memory, cost)"
    )
    ap.add_argument("--json", metavar="FILE", help="write all rows and the machine here")
    ap.add_argument("--plot", metavar="PNG", help="draw the results as a PNG")
    args = ap.parse_args(argv)
    check_outputs(args.json, plot=args.plot)
    defaults = (50_000, 2_000, 2) if args.quick else (1_000_000, 50_000, 7)
    for name, default in zip(("history_nodes", "iters", "reps"), defaults):
        if getattr(args, name) is None:
            setattr(args, name, default)
    if args.tenants_only:
        rows = bench_tenants(4_000 if args.quick else 40_000, 100_000)
        rows.append(bench_compaction(50_000 if args.quick else 400_000))
        print_rows(rows)
        out = header(command_line("python -m benchmarks trie", argv))
        out.update({"bench": "trie", "rows": rows})
        if args.json:
            write_json(args.json, out)
            print(f"wrote {args.json}")
        return 0
    if args.data == "zipf":
        texts, source = zipf_texts(400_000), "zipf(1.1) synthetic, 32k ids, repeated phrases"
    else:
        path = Path(args.data) if args.data else DEFAULT_QUESTIONS
        texts, source = spec_bench_texts(path), f"Spec-Bench questions, crude word tokens ({path})"
    stream = np.concatenate(texts)
    print(f"data: {source}: {len(texts)} texts, {stream.size} tokens")
    sizes = [1_000, 8_000] if args.quick else [1_000, 8_000, 32_000]
    rows = bench_insert(stream, args.depth, sizes, args.reps)
    cache, hist = build_history(texts, args.depth, args.history_nodes)
    rows.append(hist)
    rids = start_drafting_requests(cache, stream, 64, 1_000)
    rows += bench_draft(cache, rids, [8, 16, 32], args.iters)
    rows.append(bench_concurrent(cache, rids, stream, args.iters, 8_000 if args.quick else 32_000))
    rows += bench_tenants(4_000 if args.quick else 40_000, 100_000)
    rows.append(bench_compaction(50_000 if args.quick else 400_000))
    rows += bench_compaction_stall(texts, stream, args.depth, args.history_nodes)
    if args.peers:
        rows += peer_rows(texts, stream, args)
    print_rows(rows)
    out = header(command_line("python -m benchmarks trie", argv))
    out.update({"bench": "trie", "data": source, "depth": args.depth, "lookahead": _core.__name__, "rows": rows})  # fmt: skip
    if args.json:
        write_json(args.json, out)
        print(f"wrote {args.json}")
    if args.plot:
        from benchmarks.plot import plot_trie

        plot_trie(out, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
