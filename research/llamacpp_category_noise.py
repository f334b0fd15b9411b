"""How finely can one `python -m benchmarks llamacpp` run rank methods within a category?

    python -m research.llamacpp_category_noise [FILE.json ...]   # default: the committed runs

Issue 32 asks lookahead to be faster than llama.cpp's best n-gram speculator in at least 5
of 6 Spec-Bench categories, in one run of a few prompts per category on a 2-vCPU VM. This
measures what such a run can resolve, from the runs' own numbers (no new timing):

- Noise: on a prompt where a speculator drafted nothing, its `llama-server` decoded plainly,
  like `plain`'s server beside it in the same interleaved run: the spread of
  log(tok/s speculator / tok/s plain) over those prompts is two measurements' noise. (Also
  shown: plain `llama-server` against the engine's plain decoding, same tokens, different
  code.)
- What a lead must be: with that noise, per category n prompts, the chance that a method
  whose true speed is `lead` above another's measures faster in at least 5 of 6 categories
  (`head to head`: against one speculator, the best overall), and against the fastest of 6
  speculators of equal true speed in each category (`best of 6`, the reading earlier notes
  used: the maximum of six noisy means is biased upwards).
- Offsets no prompt count removes: each process decodes at its own speed (its memory's
  placement, its threads' cores), so a run's mean of plain `llama-server` against the
  engine's plain decoding (or against an idle speculator's server) moves between runs by
  more than its prompts' sampling explains; the excess is a per-run offset between an
  in-process method and a server.
- Each run's result in both readings, and, if lookahead's true lead in every category were its
  measured overall lead, the chance of 5 of 6 head to head; then, per category over all the
  runs given, lookahead's mean log lead over each run's best speculator overall, as measured
  and with each method against plain decoding in its own kind of process (the per-run
  offset out): what many runs say of the true standing, beyond any one run's noise; and
  per category what a drafted row costs (its share of a plain step) and returns (tokens per
  such row), for lookahead and for each run's best speculator: a row pays only where it
  returns more tokens than its share.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

import numpy as np

from benchmarks.harness import run_script
from benchmarks.llamacpp import steps_of, summarize
from benchmarks.traces import spec_bench_category

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
# The committed runs on AMD EPYC VMs (2026-12-06 and 07; BENCHMARKS.md section 7.4), not the
# Xeon's or the AVX2-held build's.
DEFAULT_FILES = ("llamacpp.json", "llamacpp_fa_auto.json", "llamacpp_fa_auto_36.json",
                 "llamacpp_fastest.json", "llamacpp_evening.json", "llamacpp_evening_fa_on.json",
                 "llamacpp_night.json", "llamacpp_night_q4_1_on.json",
                 "llamacpp_36.json")  # fmt: skip
CATEGORIES = 6
NEED = 5
DRAWS = 200_000


def speculators(methods) -> list[str]:
    return [m for m in methods if m.startswith("ngram")]


def best_speculator(summary: list[dict]) -> str:
    """The speculator with the most mean tok/s overall in a run's `summarize`."""
    overall = {x["method"]: x["tps"] for x in summary if x["category"] == "overall"}
    return max(speculators(overall), key=overall.get)


def noise_pairs(result: dict) -> tuple[list, list]:
    """log(tok/s) differences of plain decoding measured twice on one prompt: (a speculator
    that drafted nothing there against plain `llama-server`; plain `llama-server` against the
    engine's plain decoding)."""
    idle, engine = [], []
    for r in result["rows"]:
        ms = r["methods"]
        plain = ms["plain"]["tps"]
        for m in speculators(ms):
            if ms[m].get("drafted", 0) == 0 and ms[m]["identical"]:
                idle.append(math.log(ms[m]["tps"] / plain))
        if "plain (engine)" in ms:
            engine.append(math.log(ms["plain (engine)"]["tps"] / plain))
    return idle, engine


def offset_sd(groups: list[list[float]]) -> tuple[float, float, float]:
    """(sd of the groups' means, sd their sampling alone gives, the excess: a per-group
    offset's sd) of log-ratios grouped by run (groups of 5 or more)."""
    groups = [g for g in groups if len(g) >= 5]
    means = [statistics.fmean(g) for g in groups]
    between = statistics.pvariance(means)
    sampling = statistics.fmean(statistics.variance(g) / len(g) for g in groups)
    return math.sqrt(between), math.sqrt(sampling), math.sqrt(max(between - sampling, 0.0))


def category_leads(result: dict, best: str) -> dict:
    """{category: [(log(lookahead / `best`, the run's best speculator overall), the same with
    each against plain decoding in its own kind of process: lookahead over the engine's plain
    decoding, the speculator over plain `llama-server`) per prompt]}."""
    out: dict = {}
    for r in result["rows"]:
        ms = r["methods"]
        lead = math.log(ms["lookahead"]["tps"] / ms[best]["tps"])
        own = lead - math.log(ms["plain (engine)"]["tps"] / ms["plain"]["tps"])
        out.setdefault(spec_bench_category(r["category"]), []).append((lead, own))
    return out


def economics(result: dict, best: str, into: dict) -> None:
    """Adds up, per category, (decode seconds, tokens, steps, rows) of lookahead, the engine's
    plain decoding, `best` (the run's best speculator overall) and plain `llama-server`."""
    for r in result["rows"]:
        cat = spec_bench_category(r["category"])
        for name, m in (("lookahead", "lookahead"), ("plain (engine)", "plain (engine)"),
                        ("best speculator", best), ("plain", "plain")):  # fmt: skip
            x = r["methods"][m]
            steps = steps_of(x)
            got = into.setdefault((cat, name), [0.0, 0, 0, 0])
            for i, v in enumerate((x["decode_s"], x["n"], steps, steps + x.get("drafted", 0))):
                got[i] += v


def p_at_least(p: float, n: int = CATEGORIES, k: int = NEED) -> float:
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))


def phi(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def head_to_head(lead: float, sd_pair: float, n: int) -> float:
    """P(at least 5 of 6 categories measure faster) for a true log-lead `lead`, with the
    difference of two n-prompt category means spread by sd_pair / sqrt(n)."""
    return p_at_least(phi(lead / (sd_pair / math.sqrt(n))))


def best_of_six(lead: float, sd_pair: float, n: int, rng) -> float:
    """The same against the fastest of six speculators of equal true speed, each category
    mean with its own noise (sd_pair / sqrt(2 n) per method)."""
    sd = sd_pair / math.sqrt(2 * n)
    e = rng.normal(0.0, sd, size=(DRAWS, 7))
    p = float(np.mean(lead + e[:, 0] > e[:, 1:].max(axis=1)))
    return p_at_least(p)


def needed(f, target: float) -> float:
    """The smallest lead (log, to 0.001) where f(lead) reaches `target`."""
    lo, hi = 0.0, 1.0
    while hi - lo > 1e-3:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if f(mid) >= target else (mid, hi)
    return hi


def run_result(name: str, result: dict, s: list[dict], best: str, sd_pair: float) -> str:
    """One run's line: `s` its `summarize`, `best` its best speculator overall."""
    table: dict = {}
    for x in s:
        table.setdefault(x["category"], {})[x["method"]] = x["tps"]
    overall = table.pop("overall")
    la = overall["lookahead"]
    n = min(x["prompts"] for x in s if x["category"] != "overall")
    h2h = [c for c, t in table.items() if t["lookahead"] > t[best]]
    bo6 = [c for c, t in table.items() if t["lookahead"] > max(t[m] for m in speculators(t))]
    lead = math.log(la / overall[best])
    implied = head_to_head(lead, sd_pair, n) if lead > 0 else 0.0
    return (f"{name} {result['quant']} (fa {result.get('flash_attn')}, {n}/category): lookahead "
            f"{la:.1f} tok/s, {best} {overall[best]:.1f} ({100 * (la / overall[best] - 1):+.1f} %); "
            f"faster head to head in {len(h2h)}/6, than the best of 6 in {len(bo6)}/6; "
            f"P(5 of 6 head to head) at that lead everywhere: {implied:.2f}")  # fmt: skip


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m research.llamacpp_category_noise")
    ap.add_argument("files", nargs="*", help="benchmark JSON files (default: committed runs)")
    args = ap.parse_args(argv)
    files = [Path(f) for f in args.files] or [RESULTS / f for f in DEFAULT_FILES]
    runs = []
    idle, engine, engine_by_run = [], [], []
    for f in files:
        for result in json.loads(f.read_text())["results"]:
            runs.append((f.name, result))
            a, b = noise_pairs(result)
            idle += a
            engine += b
            engine_by_run.append(b)
    if len(idle) < 3:
        print("too few prompts where a speculator drafted nothing to measure the noise")
        return 1
    sd = statistics.stdev(idle)
    print(f"{len(files)} runs, {len(runs)} GGUF files")
    print(f"noise, plain decoding measured twice on a prompt (a speculator that drafted nothing "
          f"against plain llama-server): {len(idle)} prompts, log-ratio mean "
          f"{statistics.fmean(idle):+.3f}, sd {sd:.3f}")  # fmt: skip
    if len(engine) > 2:
        print(f"plain llama-server against the engine's plain decoding: {len(engine)} prompts, "
              f"log-ratio mean {statistics.fmean(engine):+.3f}, sd "
              f"{statistics.stdev(engine):.3f}")  # fmt: skip
    between, sampling, offset = offset_sd(engine_by_run)
    print(f"per run (GGUF file), mean of plain llama-server against the engine's plain decoding: "
          f"sd {between:.3f} between runs, {sampling:.3f} from the prompts' sampling alone: a "
          f"per-run offset of sd {offset:.3f} between in-process and server, whatever the "
          f"prompt count")  # fmt: skip
    rng = np.random.default_rng(0)
    print("\ntrue lead needed to measure faster in at least 5 of 6 categories, with that noise:")
    print("prompts/category   head to head: P=0.5   P=0.9   best of 6: P=0.5   P=0.9")
    for n in (3, 6, 12):
        h = [needed(lambda x, n=n: head_to_head(x, sd, n), t) for t in (0.5, 0.9)]
        b = [needed(lambda x, n=n: best_of_six(x, sd, n, rng), t) for t in (0.5, 0.9)]
        print(f"{n:>16}   " + "   ".join(f"{100 * (math.exp(v) - 1):>13.1f} %" for v in h + b))
    print("\neach run:")
    pooled: dict = {}
    money: dict = {}
    for name, result in runs:
        summary = summarize(result)
        best = best_speculator(summary)
        print(run_result(name, result, summary, best, sd))
        economics(result, best, money)
        for c, v in category_leads(result, best).items():
            pooled.setdefault(c, []).extend(v)
    print("\nper category over these runs: lookahead's log lead over the run's best speculator "
          "overall, mean +- standard error (prompts); then each against its own process's plain "
          "decoding (the engine's, llama-server's)")  # fmt: skip
    for c, v in [*pooled.items(), ("all", [x for xs in pooled.values() for x in xs])]:
        cols = []
        for j in (0, 1):
            xs = [x[j] for x in v]
            cols.append(
                f"{statistics.fmean(xs):+.3f} +- {statistics.stdev(xs) / math.sqrt(len(xs)):.3f}"
            )
        print(f"  {c:<15} {cols[0]}   {cols[1]}   ({len(v)})")
    print("\nper category over these runs: what a drafted row costs and returns, each method "
          "against plain decoding in its own kind of process: rows and tokens per step, a row "
          "beyond the first as a share of a plain step, tokens gained per such row")  # fmt: skip
    for c in pooled:
        cells = []
        for name, plain in (("lookahead", "plain (engine)"), ("best speculator", "plain")):
            s_, n, steps, rows = money[(c, name)]
            plain_step = money[(c, plain)][0] / money[(c, plain)][2]
            extra = rows / steps - 1
            row = (s_ / steps - plain_step) / plain_step / extra if extra > 0 else math.nan
            gain = (n / steps - 1) / extra if extra > 0 else math.nan
            cells.append(f"{name} {rows / steps:.2f} rows {n / steps:.2f} tok/step, a row "
                         f"{row:.2f} of a step for {gain:.2f} tokens")  # fmt: skip
        print(f"  {c:<15} " + ";  ".join(cells))
    return 0


if __name__ == "__main__":
    run_script(main, __doc__)
