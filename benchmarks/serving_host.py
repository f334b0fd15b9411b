"""Host cost of drafting for a decode batch, as the SGLang workers do it, on the recorded traces.

    python -m benchmarks.serving_host [--batch 1,16,48] [--width 12] [--json FILE]

No GPU and no model: the traces' outputs are the target's tokens. B requests decode at once
(a finished one is replaced by the next trace, until all 120 are done); each step every
drafter drafts for the whole batch, the tokens its trees would have accepted (greedy, the
longest root path equal to the true continuation) plus the bonus token are appended to each
request, and the host time of the step's drafting calls is recorded:

- **ours**: the plugin's `LookaheadDrafter` (`python/lookahead/sglang/drafter.py`) with
  SGLang's default server arguments (verify width N = 12, depth 18, capacity 10M, breadth
  10: multi-branch): `sync` (start new requests with their whole prompt, stream the new
  tokens), one `draft_batch`, `finish` for the requests that left; timed all together.
- **SGLang NGRAM**: its C++ corpus fed as `ngram_worker.py` feeds it (see
  `benchmarks.peers.sglang_ngram`): `batch_get` on every request's last 18 tokens, then
  `batch_put` of those tails (queued to its insert thread), `erase_match_state` for the ones
  that left; timed: the calls. Its insert thread's work is then waited for untimed, so it
  does not run into another drafter's turn (in SGLang it overlaps the forward on a spare
  core): this counts SGLang's critical path only, while ours includes its inserts.
- **vLLM n-gram**: its proposer's scan (`benchmarks.peers.vllm_ngram`, min = max = 5,
  k = N - 1) over each request's context, one after another.

The drafters take turns step by step (order rotating), each with its own requests, so a phase
of this VM's speed hits all alike; the whole replay runs `--rounds` times (3) and the
timings printed are the median round's. Prints, per batch size, tokens per request-step (AL),
host ms per batch step (mean, p50, p99) and µs per request-step, and our per-request time
over the next drafter's, per round. Needs the peers (`make peers`) for SGLang.
"""

from __future__ import annotations

import argparse
import sys
import time
from array import array
from types import SimpleNamespace

import numpy as np
from lookahead.output import command_line, header, write_json
from lookahead.sglang.config import ServingConfig
from lookahead.sglang.drafter import LookaheadDrafter

from benchmarks.harness import percentile
from benchmarks.peers import accepted_length
from benchmarks.traces import DEFAULT_OUT, read_traces


class Batch:
    """B live requests over the traces: contexts, true outputs, and the next trace to admit."""

    def __init__(self, traces, size):
        self.traces, self.size, self.next = traces, size, 0
        self.live = []  # [rid, req, true output]
        self.steps = self.tokens = 0
        self.host_ns: list[int] = []
        self.admit()

    def admit(self):
        while len(self.live) < self.size and self.next < len(self.traces):
            t = self.traces[self.next]
            prompt = array("q", t["prompt_ids"])
            req = SimpleNamespace(rid=f"r{self.next}", origin_input_ids_unpadded=prompt,
                                  output_ids=[int(t["output_ids"][0])], extra_key=None)  # fmt: skip
            self.live.append((req.rid, req, t["output_ids"]))
            self.next += 1

    def advance(self, trees) -> list:
        """Appends each request's accepted tokens + bonus; returns the rids that finished."""
        done = []
        for (rid, req, out), (toks, pars) in zip(self.live, trees):
            pos = len(req.output_ids)
            cap = len(out) - pos - 1
            a = accepted_length(toks, pars, out[pos : pos + max(0, min(len(toks), cap))])
            req.output_ids.extend(out[pos : pos + a + 1])
            self.steps += 1
            self.tokens += a + 1
            if len(req.output_ids) >= len(out):
                done.append(rid)
        self.live = [x for x in self.live if x[0] not in done]
        return done


class Ours:
    name = "lookahead (plugin drafter)"
    depth = 18  # SGLang's default --speculative-ngram-max-trie-depth
    config_json: str | None = None  # LOOKAHEAD_CONFIG

    def __init__(self, width):
        args = SimpleNamespace(speculative_num_draft_tokens=width, speculative_ngram_max_trie_depth=self.depth,
                               speculative_ngram_capacity=10_000_000, speculative_ngram_max_bfs_breadth=10)  # fmt: skip
        self.d = LookaheadDrafter(ServingConfig.from_args(args, self.config_json))
        self.gone: list = []

    def step(self, batch: Batch):
        reqs = [r for _, r, _ in batch.live]
        t = time.perf_counter_ns()
        self.d.finish(self.gone)
        roots = self.d.sync(reqs)
        tokens, parents, _, _ = self.d.draft([r.rid for r in reqs], roots)  # as the worker calls it
        ns = time.perf_counter_ns() - t
        trees = [(tk[1:].tolist(), (pa[1:] - 1).tolist()) for tk, pa in zip(tokens, parents)]
        return ns, trees

    def left(self, rids):
        self.gone = rids  # finished at the next step, as the worker learns of them


class Sglang:
    name = "SGLang NGRAM (C++ corpus)"

    def __init__(self, width):
        from benchmarks.peers.sglang_ngram import _import_corpus_class, mask_to_parents

        self.mask_to_parents = mask_to_parents

        self.c = _import_corpus_class()(max_trie_depth=18, min_bfs_breadth=1, max_bfs_breadth=10,
                                        draft_token_num=width, match_type="BFS", capacity=10_000_000)  # fmt: skip
        self.width, self.gone = width, []

    def step(self, batch: Batch):
        ctx = [list(r.origin_input_ids_unpadded) + r.output_ids for _, r, _ in batch.live]
        rids = [rid for rid, _, _ in batch.live]
        tails = [c[-18:] for c in ctx]
        lens = [len(c) for c in ctx]
        t = time.perf_counter_ns()
        if self.gone:
            self.c.erase_match_state(self.gone)
        self.c.synchronize()
        ids, mask = self.c.batch_get(rids, tails, lens)
        self.c.batch_put(tails)
        ns = time.perf_counter_ns() - t
        # Untimed: its insert thread must not run on into another drafter's timed turn (in
        # SGLang it overlaps the next forward on a spare core).
        self.c.synchronize()
        d = self.width
        ids, mask = np.asarray(ids).reshape(-1, d), np.asarray(mask).reshape(-1, d, d)
        trees = []
        for i in range(len(rids)):
            pars = self.mask_to_parents(mask[i])
            trees.append((ids[i, 1:].tolist(), [p - 1 for p in pars[1:]]))
        return ns, trees

    def left(self, rids):
        self.gone = rids


class Vllm:
    name = "vLLM n-gram (scan, 5/5)"

    def __init__(self, width):
        from benchmarks.peers.vllm_ngram import find_longest_matched_ngram

        self.f, self.k = find_longest_matched_ngram, width - 1
        self.f(np.zeros(16, np.int32), 5, 5, 1 << 30, 4)  # compile outside the timed steps

    def step(self, batch: Batch):
        ctx = [np.concatenate([np.frombuffer(r.origin_input_ids_unpadded, np.int64),
                               np.asarray(r.output_ids, np.int64)]).astype(np.int32)
               for _, r, _ in batch.live]  # fmt: skip
        t = time.perf_counter_ns()
        drafts = [self.f(c, 5, 5, 1 << 30, self.k) for c in ctx]
        ns = time.perf_counter_ns() - t
        return ns, [(d.tolist(), list(range(-1, len(d) - 1))) for d in drafts]

    def left(self, rids):
        pass


def run(traces, size, width, kinds):
    """All drafters over the traces at batch `size`, taking turns step by step."""
    drafters = [k(width) for k in kinds]
    batches = [Batch(traces, size) for _ in drafters]
    turn = 0
    while any(b.live for b in batches):
        for j in range(len(drafters)):
            k = (turn + j) % len(drafters)
            d, b = drafters[k], batches[k]
            if not b.live:
                continue
            ns, trees = d.step(b)
            b.host_ns.append(ns)
            d.left(b.advance(trees))
            b.admit()
        turn += 1
    rows = []
    for d, b in zip(drafters, batches):
        ms = np.asarray(b.host_ns) / 1e6
        rows.append({"batch": size, "drafter": d.name, "al": b.tokens / b.steps,
                     "request_steps": b.steps, "batch_steps": len(ms), "ms_mean": float(ms.mean()),
                     "ms_p50": percentile(ms, 50), "ms_p99": percentile(ms, 99),
                     "us_per_request_step": float(ms.sum() * 1e3 / b.steps)})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", default=str(DEFAULT_OUT))
    ap.add_argument("--batch", default="1,16,48", help="comma-separated batch sizes")
    ap.add_argument("--width", type=int, default=12, help="verify width N (SGLang's default 12)")
    ap.add_argument("--no-sglang", action="store_true", help="skip SGLang's corpus")
    ap.add_argument("--depth", type=int, default=18, help="our trie depth (SGLang's default 18)")
    ap.add_argument("--config", default=None, help="LOOKAHEAD_CONFIG JSON for ours")
    ap.add_argument("--rounds", type=int, default=3, help="repeats; timings: the median")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    traces = read_traces(args.traces)
    Ours.depth, Ours.config_json = args.depth, args.config
    if args.depth != 18 or args.config:
        Ours.name = f"lookahead (depth {args.depth}{', ' + args.config if args.config else ''})"
    kinds = [Ours, Vllm] if args.no_sglang else [Ours, Sglang, Vllm]
    out = header(command_line("python -m benchmarks.serving_host", argv))
    out["rows"] = []
    print(f"{len(traces)} traces, verify width {args.width}; host ms per batch step, median of "
          f"{args.rounds} rounds")  # fmt: skip
    print(f"{'B':>3}  {'drafter':<28}{'AL':>7}{'mean':>9}{'p50':>9}{'p99':>9}{'µs/req-step':>13}")
    for size in [int(x) for x in args.batch.split(",")]:
        rounds = [run(traces, size, args.width, kinds) for _ in range(args.rounds)]
        for j, r in enumerate(rounds[0]):
            per = [rs[j] for rs in rounds]
            # The AL is exact (the same in every round); timings: the median round.
            r = {**r, **{k: float(np.median([x[k] for x in per]))
                         for k in ("ms_mean", "ms_p50", "ms_p99", "us_per_request_step")},
                 "rounds_us_per_request_step": [x["us_per_request_step"] for x in per]}  # fmt: skip
            out["rows"].append(r)
            print(f"{size:>3}  {r['drafter']:<28}{r['al']:>7.3f}{r['ms_mean']:>9.3f}"
                  f"{r['ms_p50']:>9.3f}{r['ms_p99']:>9.3f}{r['us_per_request_step']:>13.1f}")  # fmt: skip
        if len(kinds) > 1:
            ratio = [rs[0]["us_per_request_step"] / rs[1]["us_per_request_step"] for rs in rounds]
            print(f"     ours / {rounds[0][1]['drafter']}: median {np.median(ratio):.2f}x over "
                  f"{len(ratio)} rounds (min {min(ratio):.2f}x, max {max(ratio):.2f}x)")  # fmt: skip
        sys.stdout.flush()
    if args.json:
        write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
