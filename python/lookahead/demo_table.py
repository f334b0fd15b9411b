"""The demo's table: one line per prompt, the summary per category, and the chart."""

from __future__ import annotations

import json
import os
import statistics
import sys
from dataclasses import asdict, dataclass


@dataclass
class DemoRow:
    """One prompt's outcome (times in seconds)."""

    question_id: object
    category: str
    prompt_tokens: int
    plain_tokens: int
    lookahead_tokens: int
    plain_s: float
    lookahead_s: float
    steps: int
    mean_accepted: float  # accepted draft tokens per step (bonus not counted)
    tokens_per_step: float  # emitted tokens per step (accepted + bonus)
    host_overhead: float  # (draft + mask + verify + KV fix-up) / forward time
    identical: bool
    fork: object = None  # lookahead.forks.Fork where not identical
    pld_tokens: int | None = None  # None: prompt lookup not run (--no-pld)
    pld_s: float | None = None
    pld_identical: bool | None = None
    pld_fork: object = None

    @classmethod
    def of(cls, prompt: dict, ids: list, plain_ids: list, plain_s: float, res, fork, **peer):
        """The row of `prompt` (its `ids`): plain's output and seconds, lookahead's
        `GenerationResult` and its `fork` (None when identical), and the peer's fields."""
        s = res.stats
        return cls(
            question_id=prompt["question_id"],
            category=prompt["category"],
            prompt_tokens=len(ids),
            plain_tokens=len(plain_ids),
            lookahead_tokens=len(res.ids),
            plain_s=plain_s,
            lookahead_s=s.total_s,
            steps=s.steps,
            mean_accepted=s.mean_accepted,
            tokens_per_step=s.tokens_per_step,
            host_overhead=s.host_overhead,
            identical=plain_ids == res.ids,
            fork=fork,
            **peer,
        )

    @property
    def verdict(self) -> str:
        """identical, near-tie or bug (lookahead against plain decoding)."""
        if self.identical:
            return "identical"
        return "near-tie" if self.fork is not None and self.fork.near_tie else "bug"

    @property
    def pld_tps(self) -> float | None:
        return None if self.pld_tokens is None else self.pld_tokens / self.pld_s

    @property
    def speedup_vs_pld(self) -> float | None:
        return None if self.pld_tokens is None else self.lookahead_tps / self.pld_tps

    @property
    def plain_tps(self) -> float:
        return self.plain_tokens / self.plain_s

    @property
    def lookahead_tps(self) -> float:
        return self.lookahead_tokens / self.lookahead_s

    @property
    def speedup(self) -> float:
        return self.lookahead_tps / self.plain_tps


HEADER = (
    f"{'id':>6} {'category':<14} {'prompt':>6} {'new':>5} {'plain':>7} {'PLD':>7} "
    f"{'lookahead':>9} {'vs plain':>8} {'vs PLD':>7} {'tok/step':>8}  identical to plain"
)
RED, RESET = "\033[31m", "\033[0m"


def _same(identical, fork, color: bool) -> str:
    if identical:
        return "yes"
    text = fork.describe() if fork is not None else "differs"
    return f"{RED}{text}{RESET}" if color and "BUG" in text else text


def format_row(r: DemoRow, color: bool = False) -> str:
    """One table line (tok/s; lookahead's identity, then PLD's when it differs)."""
    pld = f"{r.pld_tps:>7.1f}" if r.pld_tokens is not None else f"{'-':>7}"
    vs_pld = f"{r.speedup_vs_pld:>6.2f}x" if r.pld_tokens is not None else f"{'-':>7}"
    same = _same(r.identical, r.fork, color)
    if r.pld_identical is False:
        same += f" (PLD: {_same(False, r.pld_fork, color)})"
    return (
        f"{r.question_id!s:>6} {r.category:<14} {r.prompt_tokens:>6} {r.lookahead_tokens:>5} "
        f"{r.plain_tps:>7.1f} {pld} {r.lookahead_tps:>9.1f} {r.speedup:>7.2f}x {vs_pld} "
        f"{r.tokens_per_step:>8.2f}  {same}"
    )


def summarize(rows: list) -> list:
    """Per-category and overall summaries: median speedup, mean acc/step, identical share."""
    groups: dict = {}
    for r in rows:
        groups.setdefault(r.category, []).append(r)
    groups["overall"] = list(rows)
    out = []
    for cat, rs in groups.items():
        out.append(
            {
                "category": cat,
                "prompts": len(rs),
                "median_speedup": statistics.median(r.speedup for r in rs),
                "mean_accepted": statistics.fmean(r.mean_accepted for r in rs),
                "tokens_per_step": statistics.fmean(r.tokens_per_step for r in rs),
                "plain_tps": statistics.fmean(r.plain_tps for r in rs),
                "lookahead_tps": statistics.fmean(r.lookahead_tps for r in rs),
                "identical": sum(r.identical for r in rs),
                "near_tie": sum(r.verdict == "near-tie" for r in rs),
                "bug": sum(r.verdict == "bug" for r in rs),
                "host_overhead": statistics.fmean(r.host_overhead for r in rs),
            }
        )
        with_pld = [r for r in rs if r.pld_tokens is not None]
        if with_pld:
            out[-1].update(
                median_speedup_vs_pld=statistics.median(r.speedup_vs_pld for r in with_pld),
                median_pld_speedup=statistics.median(r.pld_tps / r.plain_tps for r in with_pld),
                pld_tps=statistics.fmean(r.pld_tps for r in with_pld),
                pld_identical=sum(bool(r.pld_identical) for r in with_pld),
            )
    return out


def format_summary(summary: list, dtype: str) -> str:
    """Summary lines, one per category and one overall."""
    lines = []
    for s in summary:
        pld = ""
        if "median_speedup_vs_pld" in s:
            pld = (
                f" ({s['median_speedup_vs_pld']:.2f}x prompt lookup, which gets "
                f"{s['median_pld_speedup']:.2f}x)"
            )
        lines.append(
            f"{s['category']:<14} median speedup {s['median_speedup']:.2f}x{pld}  mean: "
            f"plain {s['plain_tps']:.1f} tok/s  lookahead {s['lookahead_tps']:.1f} tok/s  "
            f"tok/step {s['tokens_per_step']:.2f}  identical {s['identical']}/{s['prompts']}, "
            f"near-tie forks {s['near_tie']}, wrong {s['bug']}  host overhead "
            f"{100 * s['host_overhead']:.1f}% of forward  [{dtype}]"
        )
    return "\n".join(lines)


def plot(rows: list, summary: list, path: str, dtype: str) -> None:
    """Bar charts of median speedup and mean accepted tokens per step, per category."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cats = [s["category"] for s in summary]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    axes[0].bar(cats, [s["median_speedup"] for s in summary], color="tab:blue")
    axes[0].axhline(1.0, color="grey", lw=0.8)
    axes[0].set_ylabel("median speedup over model.generate")
    axes[1].bar(cats, [s["mean_accepted"] for s in summary], color="tab:orange")
    axes[1].set_ylabel("accepted draft tokens / step")
    for ax in axes:
        ax.tick_params(axis="x", rotation=20)
    fig.suptitle(f"lookahead demo ({dtype}, {len(rows)} prompts)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def busy_note(load: float | None = None, cores: int | None = None) -> str | None:
    """A warning when the last minute's load average says other work shared the CPUs (the
    demo alone keeps it near the core count), else None."""
    if load is None:
        if not hasattr(os, "getloadavg"):
            return None
        load = os.getloadavg()[0]
    cores = cores or os.cpu_count() or 1
    if load <= 1.5 * cores:
        return None
    return (
        f"note: load average {load:.1f} on {cores} cores: other work shared the CPUs, so the "
        "tok/s and speedups are noisy (tok/step and identical are not); rerun on a quiet "
        "machine to time it"
    )


def show(rows_iter, n: int, args, label: str, fields: dict, bound: float) -> int:
    """Prints the table as `rows_iter`'s `DemoRow`s come (a progress bar on stderr), then
    the summary; writes `args.json` (with `fields`) and `args.plot`; returns 1 if any
    output differs from plain decoding by more than rounding explains, else 0."""
    from tqdm import tqdm

    color = sys.stdout.isatty()
    rows: list = []
    print(HEADER)
    with tqdm(total=n, desc="prompts", unit="prompt", file=sys.stderr) as bar:
        for row in rows_iter:
            rows.append(row)
            tqdm.write(format_row(row, color), file=sys.stdout)
            bar.update(1)
    summary = summarize(rows)
    print()
    print(format_summary(summary, label))
    busy = busy_note()
    if busy:
        print(busy, file=sys.stderr)
    if args.json:
        from lookahead.output import command_line, header, write_output

        payload = {
            **header(command_line("lookahead", None)),
            **fields,
            "rows": [
                {
                    **asdict(r),
                    "speedup": r.speedup,
                    "plain_tps": r.plain_tps,
                    "lookahead_tps": r.lookahead_tps,
                    "pld_tps": r.pld_tps,
                    "speedup_vs_pld": r.speedup_vs_pld,
                    "verdict": r.verdict,
                }
                for r in rows
            ],
            "summary": summary,
        }
        write_output(args.json, json.dumps(payload, indent=2))
    if args.plot:
        plot(rows, summary, args.plot, label)
    bugs = [r for r in rows if r.verdict == "bug"]
    if bugs:
        msg = (
            f"lookahead: {len(bugs)} output(s) differ from plain decoding by more than rounding "
            f"explains (bound {bound:.3g}): " + "; ".join(f"{r.question_id}: {r.fork.describe() if r.fork else 'differs'}" for r in bugs)
            + ". This is a bug; please report it with --json output."
        )  # fmt: skip
        print(f"{RED}{msg}{RESET}" if sys.stderr.isatty() else msg, file=sys.stderr)
        return 1
    return 0
