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
    host_overhead: float  # host time between forwards / forward time (GenerationStats)
    identical: bool
    fork: object = None  # lookahead.forks.Fork where not identical
    peer_tokens: int | None = None  # None: no peer ran (--no-pld; no llama-server)
    peer_s: float | None = None
    peer_identical: bool | None = None
    peer_fork: object = None
    # Seconds of the prompt's forward (None where plain's is not known: HF `generate`).
    plain_prefill_s: float | None = None
    lookahead_prefill_s: float | None = None

    @classmethod
    def of(
        cls,
        prompt: dict,
        ids: list,
        plain_ids: list,
        plain_s: float,
        res,
        fork,
        peer=None,
        plain_prefill_s: float | None = None,
    ):
        """The row of `prompt` (its `ids`): plain's output and seconds (and of those, its
        prompt's forward where known), lookahead's `GenerationResult` and its `fork` (None
        when identical), and the peer's (output ids, seconds, fork), or None where no peer
        ran."""
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
            plain_prefill_s=plain_prefill_s,
            lookahead_prefill_s=None if plain_prefill_s is None else s.prefill_s,
            **(
                {}
                if peer is None
                else dict(
                    peer_tokens=len(peer[0]),
                    peer_s=peer[1],
                    peer_identical=peer[0] == plain_ids,
                    peer_fork=peer[2],
                )
            ),
        )

    @property
    def verdict(self) -> str:
        """identical, near-tie or bug (lookahead against plain decoding)."""
        if self.identical:
            return "identical"
        return "near-tie" if self.fork is not None and self.fork.near_tie else "bug"

    @property
    def peer_tps(self) -> float | None:
        return None if self.peer_tokens is None else self.peer_tokens / self.peer_s

    @property
    def speedup_vs_peer(self) -> float | None:
        return None if self.peer_tokens is None else self.lookahead_tps / self.peer_tps

    @property
    def plain_tps(self) -> float:
        return self.plain_tokens / self.plain_s

    @property
    def lookahead_tps(self) -> float:
        return self.lookahead_tokens / self.lookahead_s

    @property
    def speedup(self) -> float:
        return self.lookahead_tps / self.plain_tps

    @property
    def decode_speedup(self) -> float | None:
        """Lookahead's speedup after the prompt: tokens after the first (the prompt's
        forward gives that one) over the seconds after the prompt's forward, against
        plain's; None where a prefill time is unknown or nothing came after it."""
        if self.plain_prefill_s is None or self.lookahead_prefill_s is None:
            return None
        plain_d = self.plain_s - self.plain_prefill_s
        la_d = self.lookahead_s - self.lookahead_prefill_s
        if min(self.plain_tokens, self.lookahead_tokens) < 2 or min(plain_d, la_d) <= 0:
            return None
        return ((self.lookahead_tokens - 1) / la_d) / ((self.plain_tokens - 1) / plain_d)

    @property
    def same_length_speedup(self) -> float | None:
        """Lookahead's speedup on plain's text: plain's seconds over plain's prompt seconds
        plus its seconds after the prompt divided by `decode_speedup` (None where that is).
        A fork that ends lookahead's text sooner or later than plain's changes how much the
        prompt's forward weighs in its tokens a second, and `speedup` with it; not this."""
        ds = self.decode_speedup
        return None if ds is None else at_plain_length(self.plain_s, self.plain_prefill_s, ds)

    @property
    def prefill_share(self) -> float | None:
        """The share of plain's seconds its prompt's forward took (None where unknown)."""
        return None if self.plain_prefill_s is None else self.plain_prefill_s / self.plain_s


def at_plain_length(plain_s: float, plain_prefill_s: float, decode_speedup: float) -> float:
    """A speedup on plain's text: plain's `plain_s` seconds, `plain_prefill_s` of them its
    prompt's forward, over the same prompt time plus the rest divided by `decode_speedup`."""
    return plain_s / (plain_prefill_s + (plain_s - plain_prefill_s) / decode_speedup)


@dataclass(frozen=True)
class Peer:
    """The method in the table's peer column (the HF demo's prompt lookup, the llama.cpp
    demo's llama-server speculator): `column` heads its tok/s and lookahead's speedup over
    it; `description` names it in the summary line and is the JSON's "peer"."""

    column: str
    description: str


def _widths(peer: Peer) -> tuple[int, int]:
    """The widths of the peer's tok/s column and of lookahead's speedup over it."""
    return max(7, len(peer.column)), max(7, len(peer.column) + 3)


def format_header(peer: Peer | None = None) -> str:
    """The table's column names (the peer's two columns only where `peer` is given)."""
    peer_col = vs_peer = ""
    if peer is not None:
        w, vw = _widths(peer)
        peer_col, vs_peer = f"{peer.column:>{w}} ", f"{'vs ' + peer.column:>{vw}} "
    return (
        f"{'id':>6} {'category':<14} {'prompt':>6} {'new':>5} {'plain':>7} {peer_col}"
        f"{'lookahead':>9} {'vs plain':>8} {vs_peer}{'tok/step':>8}  identical to plain"
    )


RED, RESET = "\033[31m", "\033[0m"


def _same(identical, fork, color: bool) -> str:
    if identical:
        return "yes"
    text = fork.describe() if fork is not None else "differs"
    return f"{RED}{text}{RESET}" if color and "BUG" in text else text


def format_row(r: DemoRow, color: bool = False, peer: Peer | None = None) -> str:
    """One table line (tok/s; lookahead's identity, then the peer's when it differs); the
    peer's columns where `peer` is given ('-' in them for a row it did not run)."""
    peer_cols = vs_peer = ""
    if peer is not None:
        w, vw = _widths(peer)
        ran = r.peer_tokens is not None
        peer_cols = f"{r.peer_tps:>{w}.1f} " if ran else f"{'-':>{w}} "
        vs_peer = f"{r.speedup_vs_peer:>{vw - 1}.2f}x " if ran else f"{'-':>{vw}} "
    same = _same(r.identical, r.fork, color)
    if r.peer_identical is False:
        name = peer.column if peer is not None else "peer"
        same += f" ({name}: {_same(False, r.peer_fork, color)})"
    return (
        f"{r.question_id!s:>6} {r.category:<14} {r.prompt_tokens:>6} {r.lookahead_tokens:>5} "
        f"{r.plain_tps:>7.1f} {peer_cols}{r.lookahead_tps:>9.1f} {r.speedup:>7.2f}x {vs_peer}"
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
        decode = [r.decode_speedup for r in rs if r.decode_speedup is not None]
        if decode:
            out[-1].update(
                median_decode_speedup=statistics.median(decode),
                median_same_length_speedup=statistics.median(
                    r.same_length_speedup for r in rs if r.same_length_speedup is not None
                ),
                prefill_share=statistics.fmean(
                    r.prefill_share for r in rs if r.prefill_share is not None
                ),
            )
        with_peer = [r for r in rs if r.peer_tokens is not None]
        if with_peer:
            out[-1].update(
                median_speedup_vs_peer=statistics.median(r.speedup_vs_peer for r in with_peer),
                median_peer_speedup=statistics.median(r.peer_tps / r.plain_tps for r in with_peer),
                peer_tps=statistics.fmean(r.peer_tps for r in with_peer),
                peer_identical=sum(bool(r.peer_identical) for r in with_peer),
            )
    return out


def format_summary(summary: list, dtype: str, peer: Peer | None = None) -> str:
    """Summary lines, one per category and one overall (`peer` names the peer)."""
    lines = []
    for s in summary:
        vs_peer = ""
        if "median_speedup_vs_peer" in s:
            name = peer.description if peer is not None else "the peer"
            vs_peer = (
                f" ({s['median_speedup_vs_peer']:.2f}x {name}, which gets "
                f"{s['median_peer_speedup']:.2f}x)"
            )
        lines.append(
            f"{s['category']:<14} median speedup {s['median_speedup']:.2f}x{vs_peer}  mean: "
            f"plain {s['plain_tps']:.1f} tok/s  lookahead {s['lookahead_tps']:.1f} tok/s  "
            f"tok/step {s['tokens_per_step']:.2f}  identical {s['identical']}/{s['prompts']}, "
            f"near-tie forks {s['near_tie']}, wrong {s['bug']}  host overhead "
            f"{100 * s['host_overhead']:.1f}% of forward  [{dtype}]"
        )
        if "median_decode_speedup" in s:
            lines[-1] += (
                f"\n{'':<14} after the prompt: median speedup {s['median_decode_speedup']:.2f}x "
                f"(the prompt's forward, the same for both, is {100 * s['prefill_share']:.0f}% "
                f"of plain's time); at plain's text length: median speedup "
                f"{s['median_same_length_speedup']:.2f}x"
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


def show(
    rows_iter, n: int, args, label: str, fields: dict, bound: float, peer: Peer | None = None
) -> int:
    """Prints the table as `rows_iter`'s `DemoRow`s come (a progress bar on stderr), with
    `peer`'s columns where given, then the summary; writes `args.json` (with `fields`, and
    "peer": its description, None where no row ran it) and `args.plot`; returns 1 if any
    output of lookahead differs from plain decoding by more than rounding explains, else 0."""
    from tqdm import tqdm

    color = sys.stdout.isatty()
    rows: list = []
    print(format_header(peer))
    with tqdm(total=n, desc="prompts", unit="prompt", file=sys.stderr) as bar:
        for row in rows_iter:
            rows.append(row)
            tqdm.write(format_row(row, color, peer), file=sys.stdout)
            bar.update(1)
    summary = summarize(rows)
    print()
    print(format_summary(summary, label, peer))
    busy = busy_note()
    if busy:
        print(busy, file=sys.stderr)
    ran_peer = peer is not None and any(r.peer_tokens is not None for r in rows)
    if args.json:
        from lookahead.output import command_line, header, write_output

        payload = {
            **header(command_line("lookahead", None)),
            **fields,
            "peer": peer.description if ran_peer else None,
            "rows": [
                {
                    **asdict(r),
                    "speedup": r.speedup,
                    "decode_speedup": r.decode_speedup,
                    "same_length_speedup": r.same_length_speedup,
                    "plain_tps": r.plain_tps,
                    "lookahead_tps": r.lookahead_tps,
                    "peer_tps": r.peer_tps,
                    "speedup_vs_peer": r.speedup_vs_peer,
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
