"""PNG charts of the benchmarks' results (matplotlib, the `plot` extra).

Each bench draws its chart with `--plot PNG` at the end of a run; this module also redraws one
from a saved `--json` file, so the charts in BENCHMARKS.md come from the very numbers its
tables quote:

    python -m benchmarks plot RESULT.json OUT.png

The kind of result (`accept`, `trie` or `e2e`) is read from the file.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.peers.oracle import ORACLE


def _pyplot():
    try:
        import matplotlib
    except ImportError as err:
        raise SystemExit(
            "--plot needs matplotlib: pip install 'lookahead-spec[plot]' (or matplotlib)"
        ) from err
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path) -> None:
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"wrote {path}", file=sys.stderr)


def _two_five(v, _pos) -> str:
    """Minor log tick label: only at 2x and 5x a power of ten."""
    lead = f"{v:.0e}"[0]
    return f"{v:g}" if lead in "25" else ""


def _grouped(ax, cols, series, width=None):
    """Bars of each `(label, values, bar style)` in `series`, grouped by column."""
    width = width or 0.8 / len(series)
    for i, (label, values, style) in enumerate(series):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(cols))]
        ax.bar(xs, values, width, label=label, **style)
    ax.set_xticks(range(len(cols)), cols, rotation=20)


def plot_e2e(summary: dict, cats: list[str], path) -> None:
    """`python -m benchmarks e2e`: tokens/s and speed-up over plain, per category; and for each
    lookahead policy, how many draft nodes its steps verified (a histogram)."""
    plt = _pyplot()
    cols = [*cats, "overall"]
    methods = list(summary)
    hists = {
        m: {int(k): v for k, v in summary[m]["overall"]["nodes_per_step"].items()}
        for m in methods
        if "nodes_per_step" in summary[m]["overall"]
    }
    panels = 3 if hists else 2
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.2))
    ax1, ax2 = axes[0], axes[1]
    # One colour per method in every panel.
    style = {m: {"color": f"C{i}"} for i, m in enumerate(methods)}
    _grouped(
        ax1, cols, [(m, [summary[m][c]["tokens_per_s"] for c in cols], style[m]) for m in methods]
    )
    _grouped(
        ax2,
        cols,
        [(m, [summary[m][c]["speedup"] for c in cols], style[m]) for m in methods if m != "plain"],
    )
    for ax, title in ((ax1, "tokens/s"), (ax2, "speed-up over plain generate")):
        ax.set_title(title)
        ax.legend(fontsize=8)
    ax2.axhline(1.0, color="grey", lw=0.8)
    if hists:
        ax3 = axes[2]
        widest = max(max(h) for h in hists.values())
        width = 0.8 / len(hists)
        for i, (m, h) in enumerate(hists.items()):
            n = sum(h.values()) or 1
            xs = [k + (i - (len(hists) - 1) / 2) * width for k in range(widest + 1)]
            ax3.bar(
                xs, [100 * h.get(k, 0) / n for k in range(widest + 1)], width, label=m, **style[m]
            )
        ax3.set_title("draft nodes verified per step (all prompts)")
        ax3.set_xlabel("nodes (0: the root alone)")
        ax3.set_ylabel("% of steps")
        ax3.legend(fontsize=8)
    _save(fig, path)


def _best(rows, names, col):
    """The highest AL in column `col` among `names` (0 when none)."""
    return max((rows[(n, col)]["al"] for n in names if (n, col) in rows), default=0.0)


def plot_accept(result: dict, path) -> None:
    """`python -m benchmarks accept`: per budget, AL per category of ours, the best peer variant,
    the best default peer and the copy-oracle; and every drafter's overall AL and host µs."""
    plt = _pyplot()
    budgets = result["budgets"]
    rows = {}
    for r in result["rows"]:
        rows.setdefault(r["budget"], {})[(r["drafter"], r["category"])] = r
    fig, axes = plt.subplots(len(budgets), 2, figsize=(15, 4.2 * len(budgets)), squeeze=False)
    for (ax1, ax2), b in zip(axes, budgets):
        got = rows[b]
        names = list(dict.fromkeys(n for n, _ in got))
        meta = {r["drafter"]: r for r in result["rows"] if r["budget"] == b}
        ours = [n for n in names if meta[n]["ours"]]
        peers = [n for n in names if not meta[n]["ours"] and n != ORACLE]
        defaults = [n for n in peers if meta[n]["default_peer"]]
        cols = list(dict.fromkeys(c for _, c in got if c != "overall")) + ["overall"]
        series = [(n, [got[(n, c)]["al"] for c in cols], {}) for n in ours]
        series.append(("best peer variant", [_best(got, peers, c) for c in cols], {}))
        series.append(("best default peer", [_best(got, defaults, c) for c in cols], {}))
        if ORACLE in names:
            oracle = [got[(ORACLE, c)]["al"] for c in cols]
            series.append((ORACLE, oracle, {"color": "lightgrey", "hatch": "//"}))
        _grouped(ax1, cols, series)
        ax1.set_title(f"B = {b}: tokens per step (AL) per category")
        ax1.legend(fontsize=8, ncol=2)
        order = sorted(names, key=lambda n: got[(n, "overall")]["al"])
        al = [got[(n, "overall")]["al"] for n in order]
        colors = ["tab:blue" if meta[n]["ours"] else "lightgrey" if n == ORACLE else "tab:orange"
                  for n in order]  # fmt: skip
        ax2.barh(range(len(order)), al, color=colors)
        ax2.set_yticks(range(len(order)), order, fontsize=8)
        for y, n in enumerate(order):
            us = got[(n, "overall")]["host_us_mean"]
            if us == us and n != ORACLE:  # not NaN: the oracle has no host cost
                ax2.text(al[y], y, f" {us:.1f} µs/step", va="center", fontsize=7)
        ax2.set_xlim(0, max(al) * 1.25)
        ax2.set_title(f"B = {b}: overall AL (host µs per step, mean)")
    _save(fig, path)


def plot_trie(result: dict, path) -> None:
    """`python -m benchmarks trie`: prompt indexing per token, draft cost per budget, and (with
    `--peers`) the whole step against vLLM's scan as contexts grow; log scales."""
    plt = _pyplot()
    rows = result["rows"]
    label = {"core": "ours", "sglang": "SGLang NGRAM", "suffix": "SuffixDecoding"}
    steps = [r for r in rows if r["what"].startswith(("step ctx", "draft ctx"))]
    fig, axes = plt.subplots(1, 3 if steps else 2, figsize=(15 if steps else 10, 4.2))

    index = [r for r in rows if r["what"] == "index_prompt" and r["path"] in label]
    sizes = sorted({r["size"] for r in index})
    paths = [p for p in label if any(r["path"] == p for r in index)]
    by = {(r["path"], r["size"]): r["ns_per_token"] for r in index}
    _grouped(axes[0], [f"{s:,}" for s in sizes],
             [(label[p], [by.get((p, s), 0) for s in sizes], {}) for p in paths])  # fmt: skip
    axes[0].set_title("prompt indexing, ns per token (by prompt tokens)")

    # One draft per peer and budget: our tree from the core's clock, the peers' tree drafts.
    drafts = [r for r in rows if r["what"] == "draft" and r["path"] in label]
    keep = {(r["path"], r["size"]): r["mean"] for r in drafts if r["multi_branch"]}
    budgets = sorted({s for _, s in keep})
    paths = [p for p in label if any(k[0] == p for k in keep)]
    _grouped(axes[1], [f"B = {b}" for b in budgets],
             [(label[p], [keep.get((p, b), 0) for b in budgets], {}) for p in paths])  # fmt: skip
    axes[1].set_title("tree draft on the 1M history, mean µs")

    if steps:
        ctxs = sorted({int(r["what"].split()[-1]) for r in steps})
        who = list(dict.fromkeys(r["path"] for r in steps))
        by = {(r["path"], int(r["what"].split()[-1])): r["mean"] for r in steps}
        names = {"ours-api": "ours: extend + draft", "ours-step": "ours: step()",
                 "vllm5-5": "vLLM n-gram scan 5/5", "vllm1-5": "vLLM n-gram scan 1/5"}  # fmt: skip
        for p in who:
            ys = [by.get((p, c), float("nan")) for c in ctxs]
            axes[2].plot(ctxs, ys, marker="o", label=names.get(p, p))
        axes[2].set_xscale("log")
        axes[2].set_xticks(ctxs, [f"{c:,}" for c in ctxs])
        axes[2].set_title("one step, mean µs (by context tokens)")
    for ax in axes:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
        # A panel spanning less than a decade needs its minor ticks labelled (all of them
        # then; else the 2x and 5x ones).
        lo, hi = ax.get_ylim()
        every = hi < 10 * lo
        ax.yaxis.set_minor_formatter(
            plt.FuncFormatter(lambda v, _p, every=every: f"{v:g}" if every else _two_five(v, _p))
        )
        ax.legend(fontsize=8)
    _save(fig, path)


def plot_result(result: dict, path) -> str:
    """Draws `result` (a bench's `--json` output) to `path`; returns which bench it was."""
    if result.get("bench") == "trie":
        plot_trie(result, path)
        return "trie"
    if "summary" in result and "records" in result:
        cats = [c for c in next(iter(result["summary"].values())) if c != "overall"]
        plot_e2e(result["summary"], cats, path)
        return "e2e"
    if "budgets" in result and "rows" in result:
        plot_accept(result, path)
        return "accept"
    raise SystemExit("not a result of python -m benchmarks accept, trie or e2e")


def main(argv: list[str] | None = None) -> int:
    """`python -m benchmarks plot RESULT.json OUT.png`."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks plot", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "result", help="a --json file written by python -m benchmarks accept, trie or e2e"
    )
    p.add_argument("out", help="the PNG to write")
    args = p.parse_args(argv)
    try:
        result = json.loads(Path(args.result).read_text())
    except (OSError, ValueError) as err:
        raise SystemExit(f"cannot read {args.result}: {err}") from err
    if not isinstance(result, dict):
        raise SystemExit(f"{args.result} is not a bench's --json file (a JSON object)")
    from lookahead.output import check_outputs

    check_outputs(plot=args.out)
    plot_result(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
