"""End-to-end SGLang serving benchmark: LOOKAHEAD vs NGRAM vs no speculation, on one GPU.

Needs a CUDA GPU, `sglang==0.5.23` with its CUDA dependencies, and this package installed
(`pip install lookahead-spec`, which registers the plugin). For each setting it launches

    python -m sglang.launch_server --model-path MODEL [--speculative-algorithm ...]

on 127.0.0.1, waits for it, checks that greedy outputs match the no-speculation server on a
few prompts, then runs `python -m sglang.bench_serving` on Spec-Bench prompts at each
concurrency (default 1, 4 and 16), and prints output throughput, latency and accept length
per setting. Rows go to `--out` (JSON), SGLang's raw results to `--out`'s `.raw.jsonl`.

    python benchmarks/sglang_e2e.py --model-path Qwen/Qwen2.5-7B-Instruct
    python benchmarks/sglang_e2e.py --model-path /models/llama --settings lookahead ngram \\
        --concurrency 1 16 --num-draft-tokens 16 --output-len 512

Prompts: the Spec-Bench sample shipped in `lookahead/data/` (120 questions, 6 categories),
or `--questions` for the full `question.jsonl`. Runs nothing on import; `--dry-run` prints
the commands without starting anything.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from importlib import resources
from pathlib import Path

SETTINGS = {
    "none": [],
    "ngram": ["--speculative-algorithm", "NGRAM"],
    "lookahead": ["--speculative-algorithm", "LOOKAHEAD"],
}
HOST = "127.0.0.1"


def spec_bench_questions(path: str | None) -> list[dict]:
    """Spec-Bench questions (`question_id`, `category`, `turns`) from `path` or the sample."""
    if path:
        text = Path(path).read_text(encoding="utf-8")
    else:
        text = (
            resources.files("lookahead.data")
            .joinpath("spec_bench_sample.jsonl")
            .read_text(encoding="utf-8")
        )
    qs = [json.loads(line) for line in text.splitlines() if line.strip()]
    if not qs:
        raise ValueError(f"no questions in {path or 'the packaged Spec-Bench sample'}")
    return qs


def to_custom_dataset(questions: list[dict], path: Path) -> int:
    """Writes the questions' first turns in `bench_serving --dataset-name custom` form.

    SGLang's custom loader takes `conversations[0]` as the prompt and the length of
    `conversations[1]` as the output length unless `--sharegpt-output-len` fixes it (we
    always fix it, so the placeholder answer is never used)."""
    with path.open("w", encoding="utf-8") as f:
        for q in questions:
            convs = [
                {"role": "user", "content": q["turns"][0]},
                {"role": "assistant", "content": "(fixed output length)"},
            ]
            f.write(json.dumps({"conversations": convs}) + "\n")
    return len(questions)


def server_command(args, setting: str, port: int) -> list[str]:
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", args.model_path]
    cmd += ["--host", HOST, "--port", str(port)]
    if setting != "none":
        cmd += SETTINGS[setting] + ["--speculative-num-draft-tokens", str(args.num_draft_tokens)]
    return cmd + list(args.server_args)


def bench_command(args, port: int, dataset: Path, concurrency: int, raw: Path) -> list[str]:
    num_prompts = max(args.min_prompts, args.prompts_per_slot * concurrency)
    return [
        sys.executable, "-m", "sglang.bench_serving",
        "--backend", "sglang", "--host", HOST, "--port", str(port),
        "--dataset-name", "custom", "--dataset-path", str(dataset),
        "--apply-chat-template", "--sharegpt-output-len", str(args.output_len),
        "--num-prompts", str(num_prompts), "--max-concurrency", str(concurrency),
        "--request-rate", "inf", "--seed", str(args.seed), "--output-file", str(raw),
    ]  # fmt: skip


def wait_ready(proc: subprocess.Popen, port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    url = f"http://{HOST}:{port}/health_generate"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(3)
    raise TimeoutError(f"server on port {port} not ready after {timeout_s:.0f} s")


def generate_greedy(port: int, prompts: list[str], max_new_tokens: int) -> list[str]:
    """Greedy completions from the server's native /generate endpoint."""
    out = []
    for p in prompts:
        body = json.dumps(
            {"text": p, "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens}}
        ).encode()
        req = urllib.request.Request(
            f"http://{HOST}:{port}/generate", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=600) as r:
            out.append(json.loads(r.read())["text"])
    return out


def last_json_line(path: Path) -> dict:
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    if not lines:
        raise RuntimeError(f"bench_serving wrote no result to {path}")
    return json.loads(lines[-1])


def rows_of(setting: str, concurrency: int, r: dict, context: dict) -> list[dict]:
    """Tidy rows (one per metric) from one bench_serving result."""
    metrics = [
        ("output_throughput", r.get("output_throughput"), None, "tok/s"),
        ("request_throughput", r.get("request_throughput"), None, "req/s"),
        ("e2e_latency", r.get("median_e2e_latency_ms"), r.get("p99_e2e_latency_ms"), "ms"),
        ("tpot", r.get("median_tpot_ms"), r.get("p99_tpot_ms"), "ms"),
        ("ttft", r.get("median_ttft_ms"), r.get("p99_ttft_ms"), "ms"),
        ("accept_length", r.get("accept_length"), None, "tokens/step"),
    ]
    return [
        {"what": what, "provider": setting, "size": f"concurrency={concurrency}",
         "p50": p50, "p99": p99, "unit": unit, **context}
        for what, p50, p99, unit in metrics
    ]  # fmt: skip


def print_table(rows: list[dict]) -> None:
    by = {}
    for row in rows:
        by.setdefault((row["provider"], row["size"]), {})[row["what"]] = row
    head = f"{'setting':<10} {'conc':>5} {'out tok/s':>10} {'req/s':>7} {'e2e p50 ms':>11} {'e2e p99 ms':>11} {'tpot ms':>8} {'accept':>7}"
    print(head)
    print("-" * len(head))

    def f(x, spec):
        return format(x, spec) if isinstance(x, (int, float)) else "-"

    for (setting, size), m in by.items():
        conc = size.split("=")[1]
        print(
            f"{setting:<10} {conc:>5} {f(m['output_throughput']['p50'], '10.1f')} "
            f"{f(m['request_throughput']['p50'], '7.2f')} {f(m['e2e_latency']['p50'], '11.1f')} "
            f"{f(m['e2e_latency']['p99'], '11.1f')} {f(m['tpot']['p50'], '8.2f')} "
            f"{f(m['accept_length']['p50'], '7.2f')}"
        )


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-path", required=True)
    p.add_argument(
        "--settings", nargs="+", choices=list(SETTINGS), default=["none", "ngram", "lookahead"]
    )
    p.add_argument("--concurrency", nargs="+", type=int, default=[1, 4, 16])
    p.add_argument(
        "--num-draft-tokens", type=int, default=12, help="verify width N (both algorithms)"
    )
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--prompts-per-slot", type=int, default=4, help="prompts = this x concurrency")
    p.add_argument("--min-prompts", type=int, default=16)
    p.add_argument("--questions", help="Spec-Bench question.jsonl (default: the packaged sample)")
    p.add_argument(
        "--lossless-prompts", type=int, default=8, help="greedy outputs compared with 'none'"
    )
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--ready-timeout", type=float, default=1800)
    p.add_argument("--out", default="results/sglang_e2e.json")
    p.add_argument("--dry-run", action="store_true", help="print the commands only")
    p.add_argument("server_args", nargs="*", help="after --: extra sglang.launch_server flags")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    raw = out.with_suffix(".raw.jsonl")
    dataset = out.with_suffix(".prompts.jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    questions = spec_bench_questions(args.questions)
    to_custom_dataset(questions, dataset)
    probe = [
        q["turns"][0] for q in questions[:: max(1, len(questions) // max(1, args.lossless_prompts))]
    ]
    probe = probe[: args.lossless_prompts]

    if args.dry_run:
        for s in args.settings:
            print(" ".join(server_command(args, s, args.port)))
            for c in args.concurrency:
                print("  " + " ".join(bench_command(args, args.port, dataset, c, raw)))
        return 0

    from lookahead.output import header, write_json

    context = header(" ".join(["python", "-m", "benchmarks.sglang_e2e", *(argv or sys.argv[1:])]))
    ctx_row = {
        "machine": context["machine"],
        "versions": context["versions"],
        "date": context["date"],
    }
    rows, greedy, failures = [], {}, []
    for setting in args.settings:
        cmd = server_command(args, setting, args.port)
        print(f"== {setting}: {' '.join(cmd)}", flush=True)
        proc = subprocess.Popen(cmd, start_new_session=True)
        try:
            wait_ready(proc, args.port, args.ready_timeout)
            if probe:
                greedy[setting] = generate_greedy(args.port, probe, min(args.output_len, 128))
            for c in args.concurrency:
                before = raw.read_text() if raw.exists() else ""
                subprocess.run(bench_command(args, args.port, dataset, c, raw), check=True)
                if raw.read_text() == before:
                    raise RuntimeError("bench_serving appended no result")
                rows += rows_of(setting, c, last_json_line(raw), ctx_row)
        except Exception as e:  # keep going: one broken setting must not hide the others
            failures.append(f"{setting}: {e}")
            print(f"!! {setting} failed: {e}", file=sys.stderr, flush=True)
        finally:
            stop(proc)

    lossless = {}
    if "none" in greedy:
        for s, texts in greedy.items():
            if s != "none":
                same = sum(a == b for a, b in zip(texts, greedy["none"]))
                lossless[s] = f"{same}/{len(texts)} greedy outputs identical to no speculation"
    write_json(out, {**context, "rows": rows, "lossless": lossless, "failures": failures})
    print()
    print_table(rows)
    for s, msg in lossless.items():
        print(f"{s}: {msg}")
    for f in failures:
        print(f"FAILED {f}")
    print(f"rows: {out}; raw bench_serving results: {raw}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
