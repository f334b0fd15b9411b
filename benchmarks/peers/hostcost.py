"""Host cost of the peers' indexes, for `python -m benchmarks trie --peers`.

Same token streams as ours (`benchmarks.trie`): prompt indexing at 1k / 8k / 32k tokens,
a history of about 1M tokens, drafts at budgets 8 / 16 / 32 on it, and memory per indexed
token (resident-set growth, the only measure both C++ libraries allow from outside). Each
peer is driven through its real Python entry point, as its integration calls it:

- SGLang NGRAM corpus: `batch_put` + `synchronize` (insert), `batch_get` on the last 18 tokens
  (draft); SGLang's defaults (depth 18, BFS, capacity 10M nodes).
- SuffixDecoding: `SuffixTree.extend` (the per-request prompt tree and the global response
  tree, depth 64), `SuffixDecodingCache.speculate` on the last 64 tokens (chain and tree).
- vLLM n-gram: the bare KMP scan over 1k / 8k / 32k-token contexts (it keeps no index).
- Ours next to it, per decoding step through the Python API: `extend` with the step's verified
  token and `draft` (budget 16, tree), and the fused `step`, on requests whose prompts are
  1k / 8k / 32k-token contexts (the per-step cost must not grow with the context).

Rows follow `benchmarks.trie`'s format; a peer that is not installed yields no rows and
a message on stderr.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from benchmarks.harness import percentile


def _index_row(path: str, n: int, wall: list) -> dict:
    """A prompt-indexing row: median and best wall time of indexing `n` tokens."""
    med = float(np.median(wall))
    return {
        "what": "index_prompt",
        "path": path,
        "size": n,
        "unit": "ms",
        "p50": med / 1e6,
        "min": min(wall) / 1e6,
        "ns_per_token": med / n,
    }


def _history_row(path: str, n: int, elapsed_ns: int, rss0: int) -> dict:
    """A history-building row: ns per token of `n` tokens and the RSS growth per token."""
    return {
        "what": "add_history",
        "path": path,
        "size": int(n),
        "unit": "ns/token",
        "p50": elapsed_ns / n,
        "tokens": int(n),
        "bytes_per_token": (_rss_bytes() - rss0) / n,
        "bytes_per_node": float("nan"),
    }


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _stats_us(ns) -> dict[str, float]:
    us = np.asarray(ns, dtype=np.float64) / 1e3
    return {
        "mean": float(us.mean()),
        "p50": percentile(us, 50),
        "p90": percentile(us, 90),
        "p99": percentile(us, 99),
    }


def history_stream(stream: np.ndarray, n_tokens: int) -> np.ndarray:
    """`n_tokens` of history: copies of `stream` with ids shifted per copy (new n-grams each)."""
    parts, total, shift = [], 0, 0
    while total < n_tokens:
        part = stream[: n_tokens - total].astype(np.int64) + shift
        parts.append(part)
        total += part.size
        shift += 1_000_000
    return np.concatenate(parts).astype(np.int32)


def _contexts(stream: np.ndarray, n: int, length: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    offs = rng.integers(0, max(1, stream.size - length - 1), size=n)
    return [np.ascontiguousarray(stream[o : o + length], dtype=np.int32) for o in offs]


def sglang_rows(stream, sizes, history_tokens, budgets, iters) -> list[dict]:
    """Insert and draft cost of SGLang's NGRAM corpus."""
    from benchmarks.peers.sglang_ngram import _import_corpus_class

    corpus_cls = _import_corpus_class()
    rows = []
    for n in sizes:
        prompt = np.resize(stream, n).astype(np.int32).tolist()
        wall = []
        for _ in range(3):
            c = corpus_cls(max_trie_depth=18, draft_token_num=9, capacity=10_000_000)
            t0 = time.perf_counter_ns()
            c.batch_put([prompt])
            c.synchronize()
            wall.append(time.perf_counter_ns() - t0)
        rows.append(_index_row("sglang", n, wall))
    hist = history_stream(stream, history_tokens)
    for budget in budgets:
        c = corpus_cls(max_trie_depth=18, draft_token_num=budget + 1, capacity=10_000_000)
        rss0 = _rss_bytes()
        t0 = time.perf_counter_ns()
        # The worker inserts 18-token tails; a whole document at once indexes the same windows.
        for i in range(0, hist.size, 4096):
            c.batch_put([hist[i : i + 4096].tolist()])
        c.synchronize()
        el = time.perf_counter_ns() - t0
        if budget == budgets[0]:
            rows.append(_history_row("sglang", hist.size, el, rss0))
        ctxs = _contexts(hist, 64, 18)
        ns = np.empty(iters, dtype=np.int64)
        for i in range(iters):
            tail = ctxs[i % len(ctxs)].tolist()
            t0 = time.perf_counter_ns()
            c.batch_get([f"r{i % len(ctxs)}"], [tail], [1000 + i])
            ns[i] = time.perf_counter_ns() - t0
        rows.append(
            {
                "what": "draft",
                "path": "sglang",
                "size": budget,
                "multi_branch": True,
                "unit": "us",
                **_stats_us(ns),
            }
        )
        del c
    return rows


def suffix_rows(stream, sizes, history_tokens, budgets, iters) -> list[dict]:
    """Insert and draft cost of SuffixDecoding's suffix trees."""
    from arctic_inference.suffix_decoding import SuffixDecodingCache
    from arctic_inference.suffix_decoding._C import SuffixTree

    rows = []
    for n in sizes:
        prompt = np.ascontiguousarray(np.resize(stream, n), dtype=np.int32)
        wall = []
        for _ in range(3):
            t = SuffixTree(64)
            t0 = time.perf_counter_ns()
            t.extend_ndarray(0, prompt)
            wall.append(time.perf_counter_ns() - t0)
        rows.append(_index_row("suffix", n, wall))
    hist = history_stream(stream, history_tokens)
    cache = SuffixDecodingCache(max_tree_depth=64, max_cached_requests=100000)
    rss0 = _rss_bytes()
    t0 = time.perf_counter_ns()
    docs = np.array_split(hist, max(1, hist.size // 2048))
    for i, doc in enumerate(docs):
        cache.start_request(f"h{i}", doc[:1])
        cache.add_active_response(f"h{i}", np.ascontiguousarray(doc[1:]))
        cache.stop_request(f"h{i}")
    el = time.perf_counter_ns() - t0
    rows.append(_history_row("suffix", hist.size, el, rss0))
    ctxs = _contexts(hist, 64, 1000)
    for j, ctx in enumerate(ctxs):
        cache.start_request(f"q{j}", ctx)
    for budget in budgets:
        for tree in (False, True):
            ns = np.empty(iters, dtype=np.int64)
            for i in range(iters):
                j = i % len(ctxs)
                pattern = ctxs[j][-64:]
                t0 = time.perf_counter_ns()
                cache.speculate(
                    f"q{j}",
                    pattern,
                    max_spec_tokens=budget,
                    max_spec_factor=1.0,
                    min_token_prob=0.1,
                    use_tree_spec=tree,
                )
                ns[i] = time.perf_counter_ns() - t0
            rows.append(
                {
                    "what": "draft",
                    "path": "suffix",
                    "size": budget,
                    "multi_branch": tree,
                    "unit": "us",
                    **_stats_us(ns),
                }
            )
    return rows


def step_vs_scan_rows(stream, context_sizes, budget, iters, rounds=10) -> list[dict]:
    """Our whole step next to vLLM's bare n-gram scan, on the same contexts, interleaved.

    16 requests whose prompts are `n`-token slices of `stream`; each step feeds the token
    that follows the request's context. Ours: `extend(rid, [token])` + `draft` (`ours-api`)
    and the fused `step` (`ours-step`), each on its own cache; the scan: vLLM's proposer
    (min/max n-gram 5/5 and 1/5; it keeps no index) over the same request's context at the
    same step. The variants run in `rounds` rounds whose order rotates, so drift of the
    machine's speed hits all alike; `ratio ctx n` rows give the median over rounds of our
    step's mean over the scan's.
    """
    from lookahead import LookaheadCache

    from benchmarks.peers.vllm_ngram import find_longest_matched_ngram

    n_req = 16
    rounds = max(1, min(rounds, iters))
    per = max(1, iters // rounds)
    steps = -(-(per * rounds) // n_req) + 1
    find_longest_matched_ngram(np.zeros(8, np.int32), 5, 5, 1 << 30, budget)  # numba JIT
    names = ["ours-api", "ours-step", "vllm5-5", "vllm1-5"]
    rows = []
    for n in context_sizes:
        rng = np.random.default_rng(0)
        offs = rng.integers(0, max(1, stream.size - n - steps - 1), size=n_req)
        # Python ints, as an engine holds its verified tokens.
        nexts = [stream[o + n : o + n + steps].tolist() for o in offs]
        caches = {}
        for path in names[:2]:
            caches[path] = LookaheadCache(background_indexing=False)
            for r, o in enumerate(offs):
                caches[path].start_request(r, stream[o : o + n])
        ns: dict[str, list[np.ndarray]] = {k: [] for k in names}
        for rd in range(rounds):
            for k in names[rd % 4 :] + names[: rd % 4]:
                out = np.empty(per, dtype=np.int64)
                cache = caches.get(k)
                lo = 5 if k == "vllm5-5" else 1
                for j in range(per):
                    i = rd * per + j
                    r, q = i % n_req, i // n_req
                    if k == "ours-api":
                        tok = nexts[r][q : q + 1]
                        t0 = time.perf_counter_ns()
                        cache.extend(r, tok)
                        cache.draft(r, budget, True)
                    elif k == "ours-step":
                        tok = nexts[r][q : q + 1]
                        t0 = time.perf_counter_ns()
                        cache.step(r, tok, budget, True)
                    else:
                        # The context our step drafts after: prompt + the q + 1 tokens fed so far.
                        ctx = stream[offs[r] : offs[r] + n + q + 1]
                        t0 = time.perf_counter_ns()
                        find_longest_matched_ngram(ctx, lo, 5, 1 << 30, budget)
                    out[j] = time.perf_counter_ns() - t0
                ns[k].append(out)
        for k in names:
            ours = k.startswith("ours")
            rows.append(
                {
                    "what": f"{'step' if ours else 'draft'} ctx {n}",
                    "path": k,
                    "size": budget,
                    "multi_branch": ours,
                    "unit": "us",
                    **_stats_us(np.concatenate(ns[k])),
                }
            )
        means = {k: np.array([a.mean() for a in ns[k]]) for k in names}
        for scan in names[2:]:
            ratio = means["ours-step"] / means[scan]
            rows.append(
                {
                    "what": f"ratio ctx {n}",
                    "path": f"ours-step/{scan}",
                    "rounds": rounds,
                    "unit": "x",
                    "median": float(np.median(ratio)),
                    "min": float(ratio.min()),
                    "max": float(ratio.max()),
                }
            )
    return rows


def trie_rows(texts, stream, args) -> list[dict]:
    """All peers' rows for `python -m benchmarks trie --peers` (`args.quick` shrinks the sizes)."""
    quick = bool(getattr(args, "quick", False))
    sizes = [1_000, 8_000] if quick else [1_000, 8_000, 32_000]
    history = 100_000 if quick else 1_000_000
    iters = 500 if quick else min(int(getattr(args, "iters", 5_000)), 5_000)
    stream = np.ascontiguousarray(stream, dtype=np.int32)
    rows: list[dict] = []
    for name, fn in (
        ("sglang", lambda: sglang_rows(stream, sizes, history, [8, 16, 32], iters)),
        ("arctic-inference", lambda: suffix_rows(stream, sizes, history, [8, 16, 32], iters)),
        ("vllm", lambda: step_vs_scan_rows(stream, sizes, 16, iters)),
    ):
        try:
            rows += fn()
        except ImportError as err:
            print(
                f"--peers: {name} not installed ({err}); see requirements/peers.txt",
                file=sys.stderr,
            )
    return rows
