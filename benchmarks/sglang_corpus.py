"""SGLang serving with a corpus, on this CPU: LOOKAHEAD and NGRAM, each with and without
the same corpus file, beside no speculation, in one run.

The corpus is "yesterday's answers", the case an operator feeds a drafter for: a server
without speculation answers the prompts first, and the corpus file (NGRAM's JSONL of strings)
holds those answers, the answers to as many other Spec-Bench questions as noise, and
`--noise-docs` more documents. Then each setting is a fresh real
`python -m sglang.launch_server --device cpu` (`cpu_server.py`, the `sgl_kernel` stand-in)
answering the same prompts greedily at each concurrency, interleaved; per row: output tok/s
and its ratio to no speculation, tokens per verify step (accept length), and outputs equal to
no speculation's. A second table: what loading a corpus costs each drafter over HTTP
(`/add_external_corpus` with `--load-tokens` tokens of Spec-Bench text): seconds, and the
server's RSS growth, both per million tokens.

    python -m benchmarks.sglang_corpus --per-category 2 --concurrency 1 4 \\
        --json benchmarks/results/sglang_corpus.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "sglang"))

from cpu_server import CpuServer  # noqa: E402

from benchmarks.sglang_cpu_serving import prompts_of, run_batch, summarise  # noqa: E402

NGRAM = ["--speculative-algorithm", "NGRAM", "--attention-backend", "lookahead_tree_sdpa"]
LOOKAHEAD = ["--speculative-algorithm", "LOOKAHEAD"]
CORPUS = "--speculative-ngram-external-corpus-path"
SETTINGS = [
    "none",
    "ngram",
    "ngram+corpus",
    "lookahead",
    "lookahead+corpus",
    "lookahead+corpus-rows64",
]
# LOOKAHEAD_CONFIG of a setting: -rows64 verifies every request's whole tree (N nodes) up to
# 64 rows a step, NGRAM's width, instead of the width the sizer finds fastest.
SETTING_CONFIG = {"lookahead+corpus-rows64": {"max_verify_rows": 64}}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model-path", help="HF model folder (default: SmolLM2-135M-Instruct)")
    p.add_argument("--settings", nargs="+", default=SETTINGS, choices=SETTINGS)
    p.add_argument("--concurrency", nargs="+", type=int, default=[1, 4])
    p.add_argument("--per-category", type=int, default=2)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--num-draft-tokens", type=int, default=8)
    p.add_argument("--sam-budget", type=int, default=4, help="NGRAM's corpus subtree nodes")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--load-tokens", type=int, default=1_000_000, help="0: no load table")
    p.add_argument("--json")
    p.add_argument("--log-dir")
    return p.parse_args(argv)


def args_of(setting: str, corpus: Path, n: int, sam: int) -> list[str]:
    if setting == "none":
        return []
    base = list(NGRAM if setting.startswith("ngram") else LOOKAHEAD)
    base += ["--speculative-num-draft-tokens", str(n)]
    if "+corpus" in setting:
        base += [CORPUS, str(corpus)]
        if setting.startswith("ngram"):
            base += ["--speculative-ngram-external-sam-budget", str(sam)]
    return base


def load_cost(setting: str, model: Path, args, log_dir: Path, env: dict) -> dict:
    """Seconds and RSS growth of one `/add_external_corpus` of Spec-Bench text."""
    from benchmarks.traces import default_questions

    texts = []
    for line in Path(default_questions()).read_text().splitlines():
        texts.extend(json.loads(line)["turns"])
    docs, chars = [], 0
    while chars < args.load_tokens * 4:  # ~4 characters a token
        for t in texts:
            docs.append(f"{len(docs)}: {t}")  # distinct documents, not one text repeated
            chars += len(docs[-1])
    extra = args_of(setting, Path("unused"), args.num_draft_tokens, args.sam_budget)
    if setting == "ngram":  # NGRAM's corpus endpoint needs a SAM budget at start-up
        extra += ["--speculative-ngram-external-sam-budget", str(args.sam_budget)]
    extra += ["--speculative-ngram-external-corpus-max-tokens", str(args.load_tokens * 2)]
    # Room for the whole corpus in our trie (corpora get half of it): 1M tokens of depth-18
    # n-grams take several million nodes.
    extra += ["--speculative-ngram-capacity", str(40 * args.load_tokens)]
    with CpuServer(model, extra, log_dir / f"load_{setting}.log", env=env) as server:
        server.generate("Hello", max_new_tokens=8)
        rss0 = server.rss_mb()
        t0 = time.perf_counter()
        r = server.post("/add_external_corpus", {"corpus_id": "spec", "documents": docs})
        wall = time.perf_counter() - t0
        time.sleep(1.0)
        rss1 = server.rss_mb()
    tokens = r.get("loaded_token_count", 0)
    m = max(tokens, 1) / 1e6
    return {
        "setting": setting,
        "success": r.get("success"),
        "message": r.get("message"),
        "tokens": tokens,
        "load_s": wall,
        "load_s_per_mtok": wall / m,
        "rss_mb_per_mtok": (rss1 - rss0) / m,
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    from lookahead.models import default_model_path
    from lookahead.output import header, write_json

    model = Path(args.model_path) if args.model_path else default_model_path()
    prompts = prompts_of(argparse.Namespace(questions=None, per_category=args.per_category), model)
    noise = prompts_of(
        argparse.Namespace(questions=None, per_category=2 * args.per_category), model
    )
    noise = [p for p in noise if p not in prompts]
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="sglang_corpus_"))
    log_dir.mkdir(parents=True, exist_ok=True)
    env = {"OMP_NUM_THREADS": str(args.threads)}
    # Yesterday's answers: a server without speculation answers prompts and noise once.
    with CpuServer(model, [], log_dir / "answers.log", env=env) as server:
        answered, _ = run_batch(server, prompts + noise, 4, args.output_len)
    corpus = log_dir / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r["text"]) + "\n" for r, _ in answered))
    print(f"{len(prompts)} prompts, corpus of {len(answered)} answers; logs in {log_dir}")
    rows, reference = [], {}
    settings = sorted(args.settings, key=lambda s: s != "none")
    for c in args.concurrency:
        for setting in settings:
            extra = args_of(setting, corpus, args.num_draft_tokens, args.sam_budget)
            server_env = dict(env)
            if setting.startswith("lookahead"):
                config = {"stats_interval_s": 5, **SETTING_CONFIG.get(setting, {})}
                server_env["LOOKAHEAD_CONFIG"] = json.dumps(config)
            with CpuServer(model, extra, log_dir / f"{setting}_c{c}.log", env=server_env) as s:
                s.generate("Hello", max_new_tokens=8)
                results, wall = run_batch(s, prompts, c, args.output_len)
            if setting == "none":
                reference[c] = [r["output_ids"] for r, _ in results]
            rows.append(summarise(setting, c, results, wall, reference.get(c)))
            print(json.dumps(rows[-1]), flush=True)
    from benchmarks.sglang_cpu_serving import print_table

    rows.sort(key=lambda r: (settings.index(r["setting"]), r["concurrency"]))
    print_table(rows)
    loads = []
    if args.load_tokens:
        for setting in ("ngram", "lookahead"):
            loads.append(load_cost(setting, model, args, log_dir, env))
            print(json.dumps(loads[-1]), flush=True)
        print(f"{'drafter':<10} {'tokens':>9} {'load s':>7} {'s/Mtok':>7} {'RSS MB/Mtok':>11}")
        for x in loads:
            print(
                f"{x['setting']:<10} {x['tokens']:>9} {x['load_s']:>7.1f} "
                f"{x['load_s_per_mtok']:>7.1f} {x['rss_mb_per_mtok']:>11.0f}"
            )
    if args.json:
        payload = header("python -m benchmarks.sglang_corpus " + " ".join(argv or sys.argv[1:]))
        payload.update(settings=vars(args), model=str(model), rows=rows, loads=loads)
        write_json(args.json, payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
