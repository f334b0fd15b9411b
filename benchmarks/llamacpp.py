"""lookahead on llama.cpp against llama.cpp itself: `llama-server` decoding plainly and with
each of its n-gram speculators, on Spec-Bench, in one interleaved run.

    make llama-server   # builds llama-server, llama-bench, llama-quantize (not shipped)
    python -m benchmarks llamacpp [--quants q4_1,f16] [--per-category 3] [--max-new-tokens 128]
                                  [--json FILE]

Every `llama-server` runs at once (one per setting, 127.0.0.1, 2 threads, one slot, idle
between requests); per prompt each setting and the in-process engines run back to back in
an order rotated from prompt to prompt, so the VM's drift hits all alike. Prompts are the
model's chat template around Spec-Bench's first turn, sent to the server as token ids (the
same ids every setting sees); greedy (`temperature` 0), no prompt cache.

Per setting and category: decode tok/s (tokens after the first over the time after the
prompt: the server's `predicted_*` timings, the engine's `total_s - prefill_s`), its
median ratio to plain `llama-server` over the prompts, tokens per step (drafted and
accepted for the server's speculators), and how many outputs equal plain `llama-server`'s
token for token. `lookahead` is `lookahead.llamacpp.LlamaCppGenerator` with its cost-aware
sizer (its host time per step against the forward's is printed too); `plain (engine)` is
the same library's one-sequence greedy decoding, to show in-process plain equals the
server's. Then lookahead against each speculator on the same text (`same_text`: the
prompts where both outputs equal plain's), each drafter's own host time per step
(lookahead's from its stats, `GenerationStats.drafter_s`; a speculator's from the timers
llama-server logs at verbosity 4, `speculator_host`), and the verify cost curve the engine
measured and learnt beside `llama-bench -p W -n 0`. Quantizations other than the default model's
Q4_1 file are made from it with `llama-quantize --allow-requantize` (the same weights,
dequantized: F16 is exact up to fp16 rounding of the Q4_1 values; Q8_0 and Q4_0 round
again).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import statistics
import subprocess
import time
from pathlib import Path

from benchmarks.harness import positive_int, run_script
from benchmarks.traces import CATEGORIES, DEFAULT_QUESTIONS, select_questions, spec_bench_category

ROOT = Path(__file__).resolve().parents[1]
# `make llama-server`'s binaries; `--bin` (or $LOOKAHEAD_LLAMA_BIN) another build's, e.g. one
# held to AVX2 (then point llama-cpp-python at its libllama too: LLAMA_CPP_LIB_PATH=that dir).
BIN = Path(
    os.environ.get("LOOKAHEAD_LLAMA_BIN", ROOT / "target" / "llama-server-src" / "build" / "bin")
)
OUT = ROOT / "benchmarks" / "out" / "gguf"
ENGINES = ("plain (engine)", "lookahead")
# Plain llama-server with llama.cpp's own flash-attention default (`auto`: on for the CPU),
# beside every other method at `--flash-attn` (default fastest, `LlamaCppModel`'s default:
# the setting the engine measures faster at load), where that setting is off.
FA_AUTO = "plain (fa auto)"


def gguf_of(quant: str) -> Path:
    """The default model's GGUF in `quant` (q4_1: the shipped file; others made once)."""
    from lookahead.models import default_gguf_path

    src = default_gguf_path()
    if quant.lower() == "q4_1":
        return src
    out = OUT / f"SmolLM2-135M-Instruct.{quant.upper()}.gguf"
    if not out.is_file():
        OUT.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".partial")
        cmd = [str(BIN / "llama-quantize"), "--allow-requantize", str(src), str(tmp),
               quant.upper(), "2"]  # fmt: skip
        subprocess.run(cmd, check=True, capture_output=True, timeout=600)
        tmp.rename(out)
    return out


def server_row(resp: dict) -> dict:
    t = resp["timings"]
    toks = list(resp["tokens"])
    row = {"tokens": toks, "decode_s": t["predicted_ms"] / 1e3, "n": len(toks)}
    if "draft_n" in t:
        row["drafted"], row["accepted"] = t["draft_n"], t["draft_n_accepted"]
    return row


# A speculator's cumulative counts and timers, which llama-server logs (at verbosity 4, trace)
# after every request: `common_speculative_print_stats` in the vendored common/speculative.cpp.
SPEC_STATS = re.compile(
    r"statistics\s+(\S+): #calls\(b,g,a\) =\s*(\d+)\s+(\d+)\s+(\d+),.*"
    r"dur\(b,g,a\) = ([\d.]+), ([\d.]+), ([\d.]+) ms"
)


def speculator_host(log: Path) -> dict | None:
    """A speculator's own host time from its server's log: the last (cumulative) statistics
    line of each of its implementations, summed: `begin` calls (one per prompt, which indexes
    it), `draft` calls (one per step) and `accept` calls, and the milliseconds in each. None
    when the log has no such line (plain decoding, or a build without the timers)."""
    last: dict = {}
    for line in log.read_text(errors="replace").splitlines():
        m = SPEC_STATS.search(line)
        if m:
            last[m.group(1)] = [int(x) for x in m.groups()[1:4]] + [
                float(x) for x in m.groups()[4:]
            ]
    if not last:
        return None
    tot = [sum(v[i] for v in last.values()) for i in range(6)]
    return {"calls": tot[:3], "ms": tot[3:]}


def llama_bench(model: Path, threads: int, flash_attn: str = "off") -> dict:
    """`llama-bench -p W -n 0` seconds per forward of W prompt tokens, by W."""
    from lookahead.llamacpp.model import FLASH_ATTN

    ws = "1,2,3,4,6,8,12,16,24,32"
    fa = FLASH_ATTN[flash_attn]  # llama.cpp's numbers, which llama-bench's -fa takes
    if fa is None:
        raise ValueError("llama-bench runs one flash-attention setting: off, on or auto")
    out = subprocess.run(
        [str(BIN / "llama-bench"), "-m", str(model), "-t", str(threads), "-p", ws, "-n", "0",
         "-fa", str(fa), "-r", "5", "-o", "json"],
        check=True, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    return {int(r["n_prompt"]): r["avg_ns"] / 1e9 for r in json.loads(out.stdout)}


def run_quant(quant: str, prompts: list, args, log_dir: Path) -> dict:
    from lookahead.llamacpp import LlamaCppGenerator, LlamaCppModel, plain_generate
    from lookahead.llamacpp.server import SETTINGS, Server

    model = gguf_of(quant)
    gen = LlamaCppGenerator(LlamaCppModel(model, 4096, args.threads, flash_attn=args.flash_attn))
    fa = gen.model.flash_attn  # "fastest" measured: every method runs the setting it chose
    choice = gen.model.flash_choice
    if choice is not None:
        print(f"[{quant}] {choice.describe()}", flush=True)
    bench = llama_bench(model, args.threads, fa)
    plain_m = LlamaCppModel(model, 4096, args.threads, n_seq_max=1, flash_attn=fa)
    servers: dict = {}
    rows = []
    settings = {**SETTINGS, FA_AUTO: SETTINGS["plain"]} if fa == "off" else SETTINGS
    try:
        for s, a in settings.items():  # all start at once; each is stopped whatever happens
            log = log_dir / f"{quant}-{s.replace(' ', '-')}.log"
            sfa = "auto" if s == FA_AUTO else fa
            # Verbosity 4 for the speculators' timers (a few lines a request, none a token).
            servers[s] = Server(
                BIN / "llama-server", model, [*a, "-lv", "4"], args.threads, log=log,
                flash_attn=sfa,
            )  # fmt: skip
        for s in servers.values():
            s.wait_ready()
        encoded = [gen.model.encode(q["turns"][0], chat=True) for q in prompts]
        warm = gen.model.encode("Say hello.", chat=True)
        gen.generate(warm, 8)
        for s in servers.values():
            s.complete(warm, 8)
        methods = [*servers, *ENGINES]
        for k, (q, ids) in enumerate(zip(prompts, encoded)):
            got = {}
            for m in methods[k % len(methods) :] + methods[: k % len(methods)]:
                if m in servers:
                    got[m] = server_row(servers[m].complete(ids, args.max_new_tokens))
                elif m == "lookahead":
                    res = gen.generate(ids, args.max_new_tokens)
                    st = res.stats
                    got[m] = {"tokens": res.ids, "n": len(res.ids), "steps": st.steps,
                              "decode_s": st.total_s - st.prefill_s,
                              "drafted": sum(st.draft_nodes), "accepted": sum(st.accepted),
                              "host_overhead": st.host_overhead,
                              "drafter_s": st.drafter_s}  # fmt: skip
                else:
                    t = {}
                    toks = plain_generate(plain_m, ids, args.max_new_tokens, times=t)
                    got[m] = {
                        "tokens": toks,
                        "n": len(toks),
                        "decode_s": t["total_s"] - t["prefill_s"],
                    }
            ref = got["plain"]["tokens"]
            for r in got.values():
                r["identical"] = r.pop("tokens") == ref  # the flag is kept, not the tokens
                r["tps"] = (r["n"] - 1) / r["decode_s"] if r["decode_s"] > 0 else float("nan")
            line = "  ".join(f"{m} {got[m]['tps']:.1f}" + ("" if got[m]["identical"] else "*") for m in methods)  # fmt: skip
            print(f"[{quant}] {q['category']:<14} {len(ids):>4} tok: {line}", flush=True)
            rows.append({"question_id": q["question_id"], "category": q["category"],
                         "prompt_tokens": len(ids), "methods": got})  # fmt: skip
    finally:
        for s in servers.values():
            s.close()
    host = {s: speculator_host(srv.log) for s, srv in servers.items()}
    costs = gen.sizer.cost_model
    learned = gen.sizer.learned.as_cost_model() if gen.sizer.learned is not None else None
    return {"quant": quant, "model": str(model), "flash_attn": fa, "rows": rows,
            "flash_choice": dataclasses.asdict(choice) if choice is not None else None,
            "llama_bench": bench,
            "speculator_host": {s: h for s, h in host.items() if h},
            "start_up_costs": costs.to_json() if costs else None,
            "learned_costs": learned.to_json() if learned else None}  # fmt: skip


def steps_of(run: dict) -> int:
    """One method's verify steps on one prompt: the engine's own count, else (a server) its
    tokens less the drafted ones it accepted (each step emits one token more than it
    accepts)."""
    return run["steps"] if "steps" in run else run["n"] - run.get("accepted", 0)


def summarize(result: dict) -> list[dict]:
    """Per category (and overall) and method: mean tok/s, median ratio to plain, steps."""
    out = []
    rows = result["rows"]
    cat_of = {id(r): spec_bench_category(r["category"]) for r in rows}
    cats = [c for c in CATEGORIES if c in cat_of.values()] + ["overall"]
    # The first prompt ran the methods unrotated: that order, in every category's rows (a
    # category's own first prompt ran them rotated).
    methods = list(rows[0]["methods"])
    for cat in cats:
        rs = [r for r in rows if cat == "overall" or cat_of[id(r)] == cat]
        for m in methods:
            ms = [r["methods"][m] for r in rs]
            plain = [r["methods"]["plain"]["tps"] for r in rs]
            steps = [steps_of(x) for x in ms]
            row = {"category": cat, "method": m, "prompts": len(rs),
                   "tps": statistics.fmean(x["tps"] for x in ms),
                   "median_vs_plain": statistics.median(x["tps"] / p for x, p in zip(ms, plain)),
                   "tokens_per_step": sum(x["n"] for x in ms) / max(sum(steps), 1),
                   "identical": sum(x["identical"] for x in ms)}  # fmt: skip
            if any("drafted" in x for x in ms):
                row["drafted"] = sum(x.get("drafted", 0) for x in ms)
                row["accepted"] = sum(x.get("accepted", 0) for x in ms)
            if m == "lookahead":
                row["host_overhead"] = statistics.fmean(x["host_overhead"] for x in ms)
            out.append(row)
    return out


def same_text(result: dict) -> list[dict]:
    """Lookahead against each speculator on the same text: over the prompts where both
    outputs equal plain `llama-server`'s token for token (a fork changes the text that
    follows, so two methods that fork differently decode different continuations, and a
    category's tok/s then compares different work), each method's decode tok/s (tokens
    over seconds, summed over those prompts) and plain's there."""
    from lookahead.llamacpp.server import SPECULATORS

    out = []
    runs = [r["methods"] for r in result["rows"]]
    for m in [m for m in SPECULATORS if m in runs[0]]:
        rs = [x for x in runs if x["lookahead"]["identical"] and x[m]["identical"]]
        if not rs:
            continue

        def tps(name, rs=rs):
            return sum(x[name]["n"] for x in rs) / sum(x[name]["decode_s"] for x in rs)

        out.append({"method": m, "prompts": len(rs), "lookahead_tps": tps("lookahead"),
                    "tps": tps(m), "plain_tps": tps("plain")})  # fmt: skip
    return out


def drafter_times(result: dict) -> list[tuple]:
    """(method, microseconds per step, microseconds per prompt or None) of each drafter's own
    host time: lookahead's trie draft and extend and its sizer's cut and learning
    (`GenerationStats.drafter_s`, no per-prompt part counted); a speculator's draft and accept
    calls per draft call (one a step) and its begin calls (one a prompt), by llama.cpp's own
    timers (`speculator_host`). Runs recorded before these were kept give none."""
    out = []
    runs = [r["methods"]["lookahead"] for r in result["rows"]]
    if runs and all("drafter_s" in x for x in runs):
        steps = sum(x["steps"] for x in runs)
        out.append(("lookahead", 1e6 * sum(x["drafter_s"] for x in runs) / max(steps, 1), None))
    for m, h in result.get("speculator_host", {}).items():
        (b, g, _), (ms_b, ms_g, ms_a) = h["calls"], h["ms"]
        out.append((m, 1e3 * (ms_g + ms_a) / max(g, 1), 1e3 * ms_b / max(b, 1)))
    return out


def print_tables(result: dict, summary: list) -> None:
    q = result["quant"]
    print(f"\n## {q} ({Path(result['model']).name}): decode tok/s, median ratio to plain "
          "llama-server, tokens per step, outputs identical to plain llama-server's")  # fmt: skip
    for s in summary:
        extra = f"  drafted/accepted {s['drafted']}/{s['accepted']}" if "drafted" in s else ""
        if "host_overhead" in s:
            extra += f"  host {100 * s['host_overhead']:.1f}% of forward"
        print(f"{s['category']:<14} {s['method']:<19} {s['tps']:>6.1f} tok/s  "
              f"{s['median_vs_plain']:>5.2f}x  {s['tokens_per_step']:>5.2f}/step  "
              f"identical {s['identical']}/{s['prompts']}{extra}")  # fmt: skip
    print(f"\nsame text ({q}): prompts where lookahead's output and the speculator's both equal "
          "plain llama-server's; decode tok/s summed over them")  # fmt: skip
    for s in same_text(result):
        print(f"lookahead / {s['method']:<19} {s['lookahead_tps'] / s['tps']:>5.2f}x  "
              f"({s['lookahead_tps']:.1f} / {s['tps']:.1f} tok/s, plain {s['plain_tps']:.1f}; "
              f"{s['prompts']} prompts)")  # fmt: skip
    times = drafter_times(result)
    if times:
        print(f"\ndrafter's own host time ({q}): us per step (lookahead: trie draft and extend, "
              "the sizer's cut and learning; a speculator: its draft and accept calls), and "
              "per prompt (a speculator's begin call)")  # fmt: skip
        for m, step_us, prompt_us in times:
            per_prompt = "" if prompt_us is None else f"  {prompt_us:8.1f} us/prompt"
            print(f"{m:<19} {step_us:8.1f} us/step{per_prompt}")
    bench = {int(w): t for w, t in result["llama_bench"].items()}  # JSON keys are strings
    print(f"\nforward of W rows relative to W=1 ({q}; W=1 ms in brackets)")
    print(f"llama-bench -p W -n 0 -fa {result.get('flash_attn', 'auto')} (logits: last row)  [{1e3 * bench[1]:.1f}] "
          + " ".join(f"W={w} {t / bench[1]:.2f}x" for w, t in sorted(bench.items()) if w > 1))  # fmt: skip
    for name in ("start_up_costs", "learned_costs"):
        c = result[name]
        if c:
            ms = dict(zip(c["widths"], c["ms"][0], strict=True))
            print(f"engine {name.replace('_', ' '):<28} [{ms[1]:.1f}] "
                  + " ".join(f"W={w} {t / ms[1]:.2f}x" for w, t in ms.items() if w > 1))  # fmt: skip


def main(argv=None) -> int:
    global BIN  # the binaries every helper here runs: --bin moves them
    p = argparse.ArgumentParser(prog="python -m benchmarks llamacpp")
    p.add_argument("--quants", default="q4_1,f16", help="GGUF types of the default model")
    p.add_argument("--per-category", type=positive_int, default=3)
    p.add_argument("--max-new-tokens", type=positive_int, default=128)
    p.add_argument("--threads", type=positive_int, default=2)
    p.add_argument("--flash-attn", choices=("fastest", "off", "on", "auto"), default="fastest",
                   help="llama.cpp's flash attention for every method but `plain (fa auto)`; "
                   "fastest (the engine's default): off or on as the engine measures at load")  # fmt: skip
    p.add_argument("--questions", default=str(DEFAULT_QUESTIONS))
    p.add_argument("--log-dir", default=str(ROOT / "benchmarks" / "out" / "llamacpp_logs"))
    p.add_argument("--bin", default=None, help=f"llama.cpp binaries' folder (default {BIN})")
    p.add_argument("--json", default=None)
    p.add_argument("--report", default=None, help="print the tables of a --json file, run nothing")
    args = p.parse_args(argv)
    if args.report:
        for res in json.loads(Path(args.report).read_text())["results"]:
            print_tables(res, summarize(res))
        return 0
    if args.bin:
        BIN = Path(args.bin)
    if not (BIN / "llama-server").is_file():
        raise OSError(f"{BIN / 'llama-server'} not found: run `make llama-server` first")
    from lookahead.models import cpu_features

    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    prompts = select_questions(args.questions, args.per_category)
    lib = os.environ.get("LLAMA_CPP_LIB_PATH", "llama-cpp-python's own")
    import llama_cpp

    info = llama_cpp.llama_print_system_info().decode().strip()
    print(f"# binaries {BIN}, engine libllama {lib}: {info}")
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, CPU features "
          f"{', '.join(cpu_features())}, {os.cpu_count()} CPUs, {args.threads} threads; "
          f"{len(prompts)} Spec-Bench prompts, {args.max_new_tokens} new tokens, greedy; "
          "* = output differs from plain llama-server's")  # fmt: skip
    results = []
    for quant in [x for x in args.quants.split(",") if x]:
        res = run_quant(quant, prompts, args, log_dir)
        res["summary"] = summarize(res)
        print_tables(res, res["summary"])
        results.append(res)
    if args.json:
        Path(args.json).write_text(json.dumps({"argv": argv, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    run_script(main, __doc__)
