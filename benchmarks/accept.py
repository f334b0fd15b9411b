"""Acceptance simulator: `python -m benchmarks accept`.

Replays recorded traces (`python -m benchmarks traces`) through every drafter under one protocol:

- Requests run one after another in trace order; each drafter keeps one cache for all of them,
  so earlier outputs can help later requests. Each budget B gets fresh drafters. The drafters
  take turns request by request, in an order that rotates, so a phase of the machine's speed
  hits them alike and their host costs compare within a run.
- At request start the drafter gets the prompt if its real integration does that, then the
  prefill's token (output[0]) as its first verified token.
- At each step the drafter drafts at most B tokens (a chain or a tree) after the context
  `prompt + output[:pos]`. Accepted = the longest root-to-node path equal to the true
  continuation `output[pos:]` (greedy verification), at most `len(output) - pos - 1` so the
  step's bonus token exists. The step emits accepted + 1 tokens and the drafter is told exactly
  those, as its real integration would be.
- AL (tokens per step) = emitted tokens / steps, the prefill's token excluded. Host cost is the
  wall time spent inside the drafter's draft and extend calls per step (mean, p99);
  `start_us` is the time of `start_request` (prompt indexing), per request.
- The copy-oracle (see `peers/oracle.py`) is computed at every position and reported as a
  drafter; steps where a drafter accepts more than it (possible only by chaining n-grams, e.g.
  on looping output) are counted per drafter (`over_oracle`). A drafter that accepts a token
  whose bigram with the previous token was never seen stops the run with an error: that is a
  future leak, a bug.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict

import numpy as np
from lookahead.hf.recycling import first_prompt_row
from lookahead.output import check_outputs, command_line, header, write_json

from benchmarks.harness import percentile, positive_ints
from benchmarks.peers import accepted_length, check_tree
from benchmarks.peers.oracle import ORACLE, CopyOracle
from benchmarks.traces import CATEGORIES, DEFAULT_OUT, read_traces, topk_rows

# The recycled-predictions settings `ours-recycled` runs with unless --ours-config says
# otherwise (the engine's `recycle=True` uses the same).
RECYCLE_DEFAULTS = {"recycle_k": 8}


def _ours(multi):
    def make(budget, opts):
        from benchmarks.peers.ours import OursDrafter

        return OursDrafter(multi_branch=multi, label=opts.get("label", ""), **opts.get("ours", {}))

    return make


def _recycling(multi):
    def make(budget, opts):
        from benchmarks.peers.ours import OursDrafter

        kwargs = {**RECYCLE_DEFAULTS, **opts.get("ours", {})}
        return OursDrafter(multi_branch=multi, label=opts.get("label", ""), **kwargs)

    return make


def _sglang(match_type, insert_prompt=False):
    def make(budget, opts):
        from benchmarks.peers.sglang_ngram import SglangNgramDrafter

        return SglangNgramDrafter(budget, match_type=match_type, insert_prompt=insert_prompt)

    return make


def _suffix(tree):
    def make(budget, opts):
        from benchmarks.peers.suffix_decoding import SuffixDecodingDrafter

        return SuffixDecodingDrafter(tree=tree)

    return make


def _pld(num_output_tokens):
    def make(budget, opts):
        from benchmarks.peers.pld import PldDrafter

        return PldDrafter(num_output_tokens=num_output_tokens, eos_token_id=opts.get("eos"))

    return make


def _vllm(min_n, max_n):
    def make(budget, opts):
        from benchmarks.peers.vllm_ngram import VllmNgramDrafter

        return VllmNgramDrafter(min_n=min_n, max_n=max_n)

    return make


# key: (builder, is_ours, is_default_peer_config)
DRAFTERS = {
    "ours-multi": (_ours(True), True, False),
    "ours-single": (_ours(False), True, False),
    "ours-recycled": (_recycling(True), True, False),
    "sglang-bfs": (_sglang("BFS"), False, True),
    "sglang-prob": (_sglang("PROB"), False, False),
    "sglang-bfs-prompt": (_sglang("BFS", insert_prompt=True), False, False),
    "suffix-chain": (_suffix(False), False, True),
    "suffix-tree": (_suffix(True), False, False),
    "pld": (_pld(10), False, True),
    "pld-b": (_pld(None), False, False),
    "vllm": (_vllm(5, 5), False, True),
    "vllm-1-5": (_vllm(1, 5), False, False),
}


class OracleViolation(AssertionError):
    """A drafter accepted a token it could not have seen: a future leak."""


def oracle_tables(traces, max_budget):
    """Per request: copy-oracle lengths and bigram first-seen positions (see `CopyOracle`)."""
    oracle = CopyOracle(max_budget=max_budget)
    out = []
    for r in traces:
        prompt, output = np.asarray(r["prompt_ids"]), np.asarray(r["output_ids"])
        first = oracle.first_seen(prompt, output)
        out.append((oracle.lengths(prompt, output), first))
    return out


def run_drafter(drafter, traces, oracle_lens, budget):
    """Replay all traces through one drafter; per-request rows of accepted lengths and costs.

    `oracle_lens` comes from `oracle_tables`."""
    return run_drafters([drafter], traces, oracle_lens, budget)[0]


def run_drafters(drafters, traces, oracle_lens, budget):
    """`run_drafter` for several drafters, taking turns request by request (rotating order)."""
    rows = [[] for _ in drafters]
    for rid, (req, lens) in enumerate(zip(traces, oracle_lens)):
        for j in range(len(drafters)):
            k = (rid + j) % len(drafters)
            rows[k].append(_replay(drafters[k], rid, req, lens, budget))
    return rows


def _replay(drafter, rid, req, lens, budget):
    """One request through one drafter: its row of accepted lengths and costs."""
    orac, first = lens
    prompt = np.asarray(req["prompt_ids"], dtype=np.int32)
    output = np.asarray(req["output_ids"], dtype=np.int32)
    full = np.concatenate([prompt, output])
    n_prompt = prompt.shape[0]
    rows = _prediction_rows(drafter, req)

    def extend(ctx, new):
        # The rows of the verified positions only: row i is the target's top-k after token
        # i, which the verify forward that emitted token i + 1 computed.
        if rows is None:
            drafter.extend(rid, ctx, new)
        else:
            at = len(ctx) - 1
            drafter.extend(
                rid, ctx, new, (rows[0][at : at + len(new)], rows[1][at : at + len(new)])
            )

    t0 = time.perf_counter_ns()
    if rows is not None:
        # The prefill's rows, as the engine computes them: of the last `RECYCLE_PROMPT_ROWS`
        # prompt tokens but the last (whose row chose output[0], fed below).
        lo = first_prompt_row(n_prompt - 1)
        drafter.start_request(rid, prompt, (rows[0][lo : n_prompt - 1], rows[1][lo : n_prompt - 1]))
    else:
        drafter.start_request(rid, prompt)
    start_ns = time.perf_counter_ns() - t0
    extend(prompt, output[:1])
    accepted, host, over = [], [], 0
    pos = 1
    while pos < output.shape[0]:
        ctx = full[: n_prompt + pos]
        t0 = time.perf_counter_ns()
        tokens, parents = drafter.draft(rid, ctx, budget)
        t1 = time.perf_counter_ns()
        check_tree(drafter.name, tokens, parents, budget)
        cap = output.shape[0] - pos - 1
        a = accepted_length(tokens, parents, output[pos : pos + min(budget, cap)])
        # A copy drafter cannot accept an unseen bigram; one recycling the target's
        # predictions can (it is fed only the rows of verified positions, above).
        if a and rows is None and int(first[pos : pos + a].max()) > pos:
            raise OracleViolation(
                f"{drafter.name} accepted {a} tokens at request {rid} (question "
                f"{req['question_id']}), output position {pos}, B={budget}, including a "
                f"bigram never seen before: a future leak"
            )
        over += a > min(int(orac[pos]), budget)
        t2 = time.perf_counter_ns()
        extend(ctx, output[pos : pos + a + 1])
        host.append((t1 - t0) + (time.perf_counter_ns() - t2))
        accepted.append(a)
        pos += a + 1
    drafter.finish_request(rid)
    return {
        "category": req["category"],
        "accepted": accepted,
        "host_ns": host,
        "start_ns": start_ns,
        "over_oracle": over,
    }


def _prediction_rows(drafter, req):
    """The trace's top-k rows as (uint32 ids, float32 probabilities) if `drafter` recycles
    predictions, else None; a recycling drafter on traces without them is an error."""
    if not getattr(drafter, "recycles", False):
        return None
    if "topk_ids" not in req:
        raise SystemExit(
            f"{drafter.name} needs traces with the target's top-k (python -m benchmarks traces "
            f"--add-topk 8); question {req['question_id']} has none"
        )
    return topk_rows(req)


def oracle_rows(traces, oracle_lens, budget):
    """The oracle stepped like a drafter: it accepts min(L[pos], B) at each step."""
    rows = []
    for req, (orac, _) in zip(traces, oracle_lens):
        n = len(req["output_ids"])
        accepted, pos = [], 1
        while pos < n:
            a = min(int(orac[pos]), budget)
            accepted.append(a)
            pos += a + 1
        rows.append(
            {
                "category": req["category"],
                "accepted": accepted,
                "host_ns": [],
                "start_ns": 0,
                "over_oracle": 0,
            }
        )
    return rows


def summarize(rows):
    """Per category and overall: steps, tokens, AL, host µs mean / p99, start µs mean."""
    groups = defaultdict(list)
    for r in rows:
        groups[r["category"]].append(r)
        groups["overall"].append(r)
    out = {}
    for cat, rs in groups.items():
        acc = [a for r in rs for a in r["accepted"]]
        host = [h for r in rs for h in r["host_ns"]]
        steps = len(acc)
        tokens = sum(acc) + steps
        out[cat] = {
            "steps": steps,
            "tokens": tokens,
            "al": tokens / steps if steps else float("nan"),
            "host_us_mean": float(np.mean(host)) / 1e3 if host else float("nan"),
            "host_us_p99": percentile(host, 99) / 1e3,
            "start_us_mean": float(np.mean([r["start_ns"] for r in rs])) / 1e3,
            "over_oracle_steps": int(sum(r["over_oracle"] for r in rs)),
        }
    return out


def _fmt_table(budget, names, summaries, cats, is_ours, is_default):
    cols = [*cats, "overall"]
    w = max(len(n) for n in names) + len(" / best default peer") + 1
    lines = [
        f"\nB = {budget}: tokens per step (AL); host µs per step inside the drafter",
        f"{'drafter':<{w}}"
        + "".join(f"{c[:11]:>12}" for c in cols)
        + f"{'µs mean':>10}{'µs p99':>10}{'start µs':>10}{'>oracle':>9}",
    ]
    for n in names:
        s = summaries[n]
        lines.append(
            f"{n:<{w}}"
            + "".join(f"{s.get(c, {}).get('al', float('nan')):>12.3f}" for c in cols)
            + f"{s['overall']['host_us_mean']:>10.1f}{s['overall']['host_us_p99']:>10.1f}"
            + f"{s['overall']['start_us_mean']:>10.0f}"
            + f"{s['overall']['over_oracle_steps']:>9d}"
        )
    peers = [n for n in names if not is_ours.get(n) and n != ORACLE]
    defaults = [n for n in peers if is_default.get(n)]
    ours = [n for n in names if is_ours.get(n)]
    for label, group in (("best peer", peers), ("best default peer", defaults)):
        if not group:
            continue
        best = {c: max(group, key=lambda n: summaries[n][c]["al"]) for c in cols}
        lines.append(
            f"{label:<{w}}" + "".join(f"{summaries[best[c]][c]['al']:>12.3f}" for c in cols)
        )
        for o in ours:
            lines.append(
                f"{o + ' / ' + label:<{w}}"
                + "".join(
                    f"{summaries[o][c]['al'] / summaries[best[c]][c]['al']:>11.3f}x" for c in cols
                )
            )
    if ORACLE in summaries:
        for o in ours:
            lines.append(
                f"{o + ' / oracle':<{w}}"
                + "".join(
                    f"{summaries[o][c]['al'] / summaries[ORACLE][c]['al']:>11.1%} " for c in cols
                )
            )
    return "\n".join(lines)


def _parse_value(k, v):
    """One --ours-config value: a bool, `none`, a number, or numbers joined by commas (a tuple)."""
    if v.lower() in ("true", "false"):
        return v.lower() == "true"
    if v.lower() == "none":
        return None
    parts = v.split(",")
    try:
        nums = [int(x) if x.strip().lstrip("-").isdigit() else float(x) for x in parts]
    except ValueError as err:
        raise SystemExit(
            f"--ours-config {k}: not a bool, none, number or numbers joined by commas: {v!r}"
        ) from err
    return tuple(nums) if len(nums) > 1 else nums[0]


def _parse_kv(items):
    out = {}
    for item in items or ():
        if "=" not in item:
            raise SystemExit(f"--ours-config expects KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        out[k] = _parse_value(k, v)
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the simulator; see the module docstring."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks accept", description="Acceptance simulator over recorded traces."
    )
    p.add_argument(
        "--traces", default=DEFAULT_OUT, help="recorded traces (python -m benchmarks traces)"
    )
    p.add_argument(
        "--budgets", type=positive_ints, default=[8, 16, 32], help="comma-separated draft budgets B"
    )
    p.add_argument(
        "--drafters",
        default=",".join(DRAFTERS),
        help=f"comma-separated subset of: {', '.join(DRAFTERS)}",
    )
    p.add_argument(
        "--per-category",
        type=int,
        default=0,
        help="use only the first N requests of each category (0: all)",
    )
    p.add_argument(
        "--ours-config",
        action="append",
        metavar="KEY=VALUE",
        help="LookaheadCache constructor argument for ours (repeatable); VALUE: true/false, "
        "none, a number, or numbers joined by commas (history_skip=3,6)",
    )
    p.add_argument("--label", default="", help="suffix for our drafters' names")
    p.add_argument("--strict", action="store_true", help="fail if a peer is not installed")
    p.add_argument("--json", default=None, help="write the full results here")
    p.add_argument("--plot", default=None, metavar="PNG", help="draw the tables as a PNG")
    args = p.parse_args(argv)

    budgets = args.budgets
    check_outputs(args.json, plot=args.plot)
    if args.per_category < 0:
        raise SystemExit(f"--per-category must be >= 0 (0: all), got {args.per_category}")
    ours = _parse_kv(args.ours_config)
    try:  # a bad --ours-config fails now, not after the peers have run
        from lookahead import LookaheadCache

        LookaheadCache(**ours)
    except (TypeError, ValueError) as e:
        raise SystemExit(f"--ours-config: {e}") from None
    names = [n for n in args.drafters.split(",") if n]
    unknown = [n for n in names if n not in DRAFTERS]
    if unknown:
        raise SystemExit(f"unknown drafters {unknown}; choose from {list(DRAFTERS)}")
    traces = read_traces(args.traces)
    if args.per_category:
        seen = defaultdict(int)
        kept = []
        for r in traces:
            if seen[r["category"]] < args.per_category:
                kept.append(r)
                seen[r["category"]] += 1
        traces = kept
    cats = [c for c in CATEGORIES if any(r["category"] == c for r in traces)]
    opts = {
        "eos": traces[0].get("eos_token_id"),
        "ours": ours,
        "label": args.label,
    }

    t0 = time.perf_counter()
    oracle_lens = oracle_tables(traces, max(budgets))
    print(
        f"copy-oracle over {len(traces)} requests: {time.perf_counter() - t0:.1f} s",
        file=sys.stderr,
    )

    result = header(command_line("python -m benchmarks accept", argv))
    result.update(
        {
            "traces": args.traces,
            "requests": len(traces),
            "budgets": budgets,
            "ours_config": opts["ours"],
            "skipped": {},
            "rows": [],
        }
    )
    is_ours = {}
    is_default = {}
    for budget in budgets:
        summaries = {}
        drafters = []
        for key in names:
            make, ours, default = DRAFTERS[key]
            try:
                drafter = make(budget, opts)
            except ImportError as err:
                if args.strict:
                    raise
                result["skipped"][key] = str(err)
                print(f"skipping {key}: {err}", file=sys.stderr)
                continue
            drafters.append(drafter)
            is_ours[drafter.name], is_default[drafter.name] = ours, default
        t = time.perf_counter()
        for drafter, rows in zip(drafters, run_drafters(drafters, traces, oracle_lens, budget)):
            summaries[drafter.name] = summarize(rows)
        print(
            f"B={budget}: {len(drafters)} drafters, {time.perf_counter() - t:.1f} s",
            file=sys.stderr,
        )
        summaries[ORACLE] = summarize(oracle_rows(traces, oracle_lens, budget))
        order = list(summaries)
        print(_fmt_table(budget, order, summaries, cats, is_ours, is_default))
        for name in order:
            for cat, s in summaries[name].items():
                result["rows"].append(
                    {
                        "budget": budget,
                        "drafter": name,
                        "category": cat,
                        "ours": is_ours.get(name, False),
                        "default_peer": is_default.get(name, False),
                        **s,
                    }
                )
    if args.json:
        write_json(args.json, result)
    if args.plot:
        from benchmarks.plot import plot_accept

        plot_accept(result, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
