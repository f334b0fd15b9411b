"""SGLang serving on this CPU: LOOKAHEAD vs NGRAM vs no speculation, in one run.

Each setting is a real `python -m sglang.launch_server --device cpu` (started one after the
other, so they never share the cores) with the `sgl_kernel` stand-in of the tests
(`tests/sglang/stand_in/`: SGLang's CPU ops are built for Xeon and not on PyPI). NGRAM gets
`--attention-backend lookahead_tree_sdpa`, the tree-masked attention LOOKAHEAD selects on a
CPU without AMX (SGLang's `torch_native` cannot verify a tree). Spec-Bench prompts (first
turns, chat template applied) go through `/generate`, greedy, `--output-len` new tokens each,
at every concurrency, each on a fresh server; per setting and concurrency it prints output throughput (and its ratio
to no speculation), median and p90 request latency, tokens per verify step, and how many
outputs equal the no-speculation server's token for token.

    python -m benchmarks.sglang_cpu_serving                      # the default model
    python -m benchmarks.sglang_cpu_serving --per-category 2 --concurrency 1 4 16 \\
        --json benchmarks/results/sglang_cpu_serving.json
    python -m benchmarks.sglang_cpu_serving --constraint json ...   # structured output

`--constraint json` sends every request with a JSON schema (`ANSWER_SCHEMA`, xgrammar), and
without `ignore_eos` (a finished grammar allows only the end of text), so rows compare
constrained decoding with and without speculation.

The default model is SmolLM2-135M-Instruct (`lookahead.models.default_model_path()`, fetched
and converted once). SGLang's own `bench_serving` is not used: its dataset loaders import HF
`datasets`, which this environment does not install.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "sglang"))

from cpu_server import CpuServer  # noqa: E402

SETTINGS = {
    "none": [],
    "ngram": ["--speculative-algorithm", "NGRAM", "--attention-backend", "lookahead_tree_sdpa"],
    "lookahead": ["--speculative-algorithm", "LOOKAHEAD"],
    # LOOKAHEAD with the fixed rule the sizer replaced: 64 verify rows per CPU step
    "lookahead-rows64": ["--speculative-algorithm", "LOOKAHEAD"],
}
# The schema of `--constraint json`: an answer and its key points.
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "string"},
        "points": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["answer", "points"],
}
# LOOKAHEAD_CONFIG of a setting (`--lookahead-config` adds to it).
SETTING_CONFIG = {"lookahead-rows64": {"max_verify_rows": 64}}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model-path", help="HF model folder (default: SmolLM2-135M-Instruct)")
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    p.add_argument("--concurrency", nargs="+", type=int, default=[1, 4, 16])
    p.add_argument("--per-category", type=int, default=2, help="Spec-Bench questions each")
    p.add_argument("--questions", help="Spec-Bench question.jsonl (default: bench's default)")
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--num-draft-tokens", type=int, default=8)
    p.add_argument("--threads", type=int, default=2, help="torch threads per server")
    p.add_argument("--constraint", choices=["none", "json"], default="none")
    p.add_argument("--lookahead-config", help="LOOKAHEAD_CONFIG JSON for the lookahead server")
    p.add_argument("--json", help="write rows and settings here")
    p.add_argument("--log-dir", help="keep server logs here (default: a temp folder)")
    p.add_argument("server_args", nargs="*", help="after --: extra launch_server arguments")
    return p.parse_args(argv)


def prompts_of(args, model_path: Path) -> list[tuple[str, str]]:
    from transformers import AutoTokenizer

    from benchmarks.traces import default_questions, select_questions

    tok = AutoTokenizer.from_pretrained(model_path)
    qs = select_questions(args.questions or default_questions(), args.per_category)
    out = []
    for q in qs:
        msgs = [{"role": "user", "content": q["turns"][0]}]
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        out.append((q["category"], text))
    return out


def request_params(constraint: str) -> dict:
    """Sampling params of every request under `--constraint`."""
    if constraint == "json":
        return {"json_schema": json.dumps(ANSWER_SCHEMA)}
    return {"ignore_eos": True}


def run_batch(server: CpuServer, prompts, concurrency: int, output_len: int, params=None):
    params = {"ignore_eos": True} if params is None else params

    def one(text):
        t0 = time.perf_counter()
        r = server.generate(text, max_new_tokens=output_len, **params)
        return r, time.perf_counter() - t0

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(one, [t for _, t in prompts]))
    return results, time.perf_counter() - t0


def summarise(setting, concurrency, results, wall, reference) -> dict:
    tokens = sum(r["meta_info"]["completion_tokens"] for r, _ in results)
    steps = sum(r["meta_info"].get("spec_verify_ct", 0) for r, _ in results)
    lat = sorted(s for _, s in results)
    same = None
    if reference is not None:
        same = sum(r["output_ids"] == ref for (r, _), ref in zip(results, reference))
    return {
        "setting": setting,
        "concurrency": concurrency,
        "requests": len(results),
        "output_tok_s": tokens / wall,
        "latency_p50_s": statistics.median(lat),
        "latency_p90_s": lat[min(len(lat) - 1, int(0.9 * len(lat)))],
        # tokens per verify step, the prefill's first token left out
        "tokens_per_step": (tokens - len(results)) / steps if steps else None,
        "identical": same,
    }


def print_table(rows) -> None:
    base = {r["concurrency"]: r["output_tok_s"] for r in rows if r["setting"] == "none"}
    print(
        f"{'setting':<16} {'conc':>4} {'tok/s':>8} {'vs none':>8} {'p50 s':>7} {'p90 s':>7} "
        f"{'tok/step':>8} {'identical':>10}"
    )
    for r in rows:
        ratio = r["output_tok_s"] / base[r["concurrency"]] if r["concurrency"] in base else None
        tps = "-" if r["tokens_per_step"] is None else f"{r['tokens_per_step']:.2f}"
        same = "-" if r["identical"] is None else f"{r['identical']}/{r['requests']}"
        print(
            f"{r['setting']:<16} {r['concurrency']:>4} {r['output_tok_s']:>8.1f} "
            f"{'-' if ratio is None else f'{ratio:.2f}x':>8} {r['latency_p50_s']:>7.2f} "
            f"{r['latency_p90_s']:>7.2f} {tps:>8} {same:>10}"
        )


def main(argv=None) -> int:
    args = parse_args(argv)
    from lookahead.models import default_model_path
    from lookahead.output import header, write_json

    model_path = Path(args.model_path) if args.model_path else default_model_path()
    prompts = prompts_of(args, model_path)
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="sglang_cpu_serving_"))
    log_dir.mkdir(parents=True, exist_ok=True)
    env = {"OMP_NUM_THREADS": str(args.threads)}
    print(f"{len(prompts)} prompts, {args.output_len} new tokens each; logs in {log_dir}")
    settings = sorted(args.settings, key=lambda s: s != "none")  # the reference first
    rows, reference = [], {}
    # Interleaved: every setting at one concurrency, then the next, so that a machine that
    # slows down for some minutes slows every setting alike.
    for c in args.concurrency:
        for setting in settings:
            extra = SETTINGS[setting]
            if setting != "none":
                extra = extra + ["--speculative-num-draft-tokens", str(args.num_draft_tokens)]
            server_env = dict(env)
            ours = setting.startswith("lookahead")
            if ours:  # a stats line every 5 s: the row reports the last one's widths and sizer
                config = {"stats_interval_s": 5, **SETTING_CONFIG.get(setting, {})}
                config.update(json.loads(args.lookahead_config or "{}"))
                server_env["LOOKAHEAD_CONFIG"] = json.dumps(config)
            # A fresh server per concurrency: the prompts repeat between concurrencies, and a
            # drafter that kept the earlier answers would draft them from memory.
            log = log_dir / f"{setting}_c{c}.log"
            server_args = extra + list(args.server_args)
            with CpuServer(model_path, server_args, log, env=server_env) as server:
                server.generate("Hello", max_new_tokens=8)  # warm-up
                results, wall = run_batch(
                    server, prompts, c, args.output_len, request_params(args.constraint)
                )
                stats = server.stats_lines() if ours else []
            ref = reference.get(c)
            if setting == "none":
                reference[c] = [r["output_ids"] for r, _ in results]
            rows.append(summarise(setting, c, results, wall, ref))
            if stats:  # the verify widths the steps ran at, and what the sizer measured
                rows[-1]["verify_widths"] = stats[-1].get("verify_widths")
                rows[-1]["sizer"] = stats[-1].get("sizer")
            print(json.dumps(rows[-1]), flush=True)
    rows.sort(key=lambda r: (settings.index(r["setting"]), r["concurrency"]))
    print_table(rows)
    if args.json:
        payload = header(
            "python -m benchmarks.sglang_cpu_serving " + " ".join(argv or sys.argv[1:])
        )
        payload.update(settings=vars(args), model=str(model_path), rows=rows)
        write_json(args.json, payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
