"""The `lookahead` command: argument handling, the shipped prompts, the demo loop on a tiny model."""

from __future__ import annotations

import json
from importlib import resources
from types import SimpleNamespace

import pytest
import torch
from lookahead import cli, demo
from tiny_models import tiny_model, tiny_tokenizer


def test_bench_is_delegated(capsys):
    assert cli.main(["bench", "--help"]) == 0
    assert "lookahead bench" in capsys.readouterr().err
    assert cli.main(["bench", "no-such-bench"]) == 2


def test_bad_arguments_exit_with_a_message(capsys):
    assert cli.main(["demo", "--max-new-tokens", "0"]) == 2
    assert "--max-new-tokens" in capsys.readouterr().err
    assert cli.main(["generate", "--prompt", "x", "--budget", "-1"]) == 2
    assert cli.main(["demo", "--max-budget", "-1"]) == 2
    assert "--max-budget must be >= 0" in capsys.readouterr().err
    assert cli.main(["demo", "--count", "0"]) == 2
    with pytest.raises(SystemExit):
        cli.main(["demo", "--dtype", "float16"])
    with pytest.raises(SystemExit):
        cli.main(["generate"])  # --prompt is required


def test_parser_defaults():
    args = cli.build_parser().parse_args(["demo"])
    assert args.dtype == "auto"
    assert args.categories == "rag,summarization"
    assert args.budget is None and args.max_budget is None and not args.single_branch


def test_shipped_sample_and_attribution():
    data = resources.files("lookahead").joinpath("data")
    rows = [
        json.loads(x) for x in data.joinpath("spec_bench_sample.jsonl").read_text().splitlines()
    ]
    cats = {}
    for r in rows:
        assert set(r) == {"question_id", "category", "turns"}
        cats[r["category"]] = cats.get(r["category"], 0) + 1
    for c in ("translation", "summarization", "qa", "math_reasoning", "rag"):
        assert cats[c] == 20
    assert "Apache License" in data.joinpath("LICENSE.spec_bench").read_text()
    assert "Spec-Bench" in data.joinpath("NOTICE").read_text()


def test_load_prompts_selection_and_errors(tmp_path):
    rows = demo.load_prompts(None, ["rag", "summarization"], 3)
    assert [r["category"] for r in rows].count("rag") == 3
    assert len(rows) == 6
    with pytest.raises(ValueError, match="unknown categories"):
        demo.load_prompts(None, ["nope"], 1)
    own = tmp_path / "p.jsonl"
    own.write_text('{"prompt": "hi"}\n{"turns": ["a", "b"], "category": "x"}\n')
    assert [r["turns"][0] for r in demo.load_prompts(own, None, None)] == ["hi", "a"]
    own.write_text('{"text": 1}\n')
    with pytest.raises(ValueError, match="line 1"):
        demo.load_prompts(own, None, None)


def test_demo_rows_summary_json_and_plot(tmp_path):
    torch.set_num_threads(1)
    model, tok = tiny_model("llama", seed=3), tiny_tokenizer()
    prompts = [
        {"question_id": 1, "category": "a", "turns": ["abcabcabcabc"]},
        {"question_id": 2, "category": "b", "turns": ["xyzxyzxyz"]},
    ]
    rows = list(demo.run(model, tok, prompts, max_new_tokens=12, budget=6))
    assert [r.question_id for r in rows] == [1, 2]
    assert all(r.identical for r in rows)  # fp32: plain and lookahead agree
    summary = demo.summarize(rows)
    assert [s["category"] for s in summary] == ["a", "b", "overall"]
    text = demo.format_summary(summary, "float32")
    assert "median speedup" in text and "[float32]" in text
    assert "yes" in demo.format_row(rows[0])
    demo.plot(rows, summary, str(tmp_path / "p.png"), "float32")
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_demo_main_writes_json(tmp_path, monkeypatch, capsys):
    model, tok = tiny_model("gemma", seed=4), tiny_tokenizer()
    monkeypatch.setattr("lookahead.models.load_model", lambda *a, **k: (model, tok))
    own = tmp_path / "p.jsonl"
    own.write_text('{"question_id": 7, "category": "c", "turns": ["ababababab"]}\n')
    args = SimpleNamespace(
        categories="",
        prompts=str(own),
        count=2,
        model=None,
        dtype="float32",
        max_new_tokens=10,
        budget=None,
        max_budget=12,
        depth=8,
        single_branch=False,
        json=str(tmp_path / "out.json"),
        plot=None,
    )
    assert demo.main(args) == 0
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["max_budget"] == 12
    row = out["rows"][0]
    assert row["question_id"] == 7 and row["identical"] is True
    for key in ("plain_s", "lookahead_s", "mean_accepted", "lookahead_tokens", "category"):
        assert key in row
    assert "overall" in capsys.readouterr().out
