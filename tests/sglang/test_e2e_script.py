"""The GPU end-to-end script's prompt file is what SGLang's bench_serving reads."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_script():
    spec = importlib.util.spec_from_file_location(
        "sglang_e2e", ROOT / "benchmarks" / "sglang_e2e.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_prompt_file_has_the_shape_sglangs_custom_dataset_reads(tmp_path):
    """SGLang's `custom` loader (benchmark/datasets/custom.py) keeps rows whose
    `conversations` hold >= 2 turns and takes turn 0's `content` as the prompt. (Importing
    the loader itself pulls HF `datasets`, which this CPU environment does not carry; the
    GPU run exercises it.)"""
    import json

    e2e = load_script()
    questions = e2e.spec_bench_questions(None)
    assert len(questions) == 120
    path = tmp_path / "prompts.jsonl"
    assert e2e.to_custom_dataset(questions, path) == 120
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 120
    for row, q in zip(rows, questions):
        convs = row["conversations"]
        assert len(convs) >= 2 and convs[0]["role"] == "user"
        assert convs[0]["content"] == q["turns"][0]


def test_commands_and_rows(tmp_path):
    e2e = load_script()
    args = e2e.parse_args(["--model-path", "m", "--num-draft-tokens", "16", "--", "--tp-size", "2"])
    cmd = e2e.server_command(args, "lookahead", 31000)
    assert cmd[1:3] == ["-m", "sglang.launch_server"]
    assert cmd[cmd.index("--speculative-algorithm") + 1] == "LOOKAHEAD"
    assert cmd[cmd.index("--speculative-num-draft-tokens") + 1] == "16"
    assert cmd[-2:] == ["--tp-size", "2"]
    assert "--speculative-algorithm" not in e2e.server_command(args, "none", 31000)
    bench = e2e.bench_command(args, 31000, tmp_path / "p.jsonl", 16, tmp_path / "r.jsonl")
    assert bench[bench.index("--max-concurrency") + 1] == "16"
    assert bench[bench.index("--num-prompts") + 1] == "64"
    rows = e2e.rows_of("lookahead", 4, {"output_throughput": 100.0, "accept_length": 2.5}, {})
    by = {r["what"]: r for r in rows}
    assert by["output_throughput"]["p50"] == 100.0 and by["accept_length"]["p50"] == 2.5
    assert by["e2e_latency"]["p50"] is None and by["tpot"]["unit"] == "ms"
