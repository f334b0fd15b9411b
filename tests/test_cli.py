"""The `lookahead` command: argument handling, the shipped prompts, the demo loop on a tiny model."""

from __future__ import annotations

import json
from importlib import resources
from types import SimpleNamespace

import pytest
import torch
from lookahead import cli, demo, demo_table
from tiny_models import tiny_model, tiny_tokenizer


def test_bench_moved_out_of_the_package(capsys):
    # The benchmarks compare against peers a user does not install: they run from a clone.
    assert cli.main(["bench", "accept", "--budgets", "16"]) == 2
    assert "python -m benchmarks accept ..." in capsys.readouterr().err
    import benchmarks

    assert benchmarks.main(["--help"]) == 0
    err = capsys.readouterr().err
    assert "python -m benchmarks" in err and "acceptance simulator" in err
    assert benchmarks.main(["no-such-bench"]) == 2
    assert "unknown benchmark 'no-such-bench'" in capsys.readouterr().err


def test_bad_arguments_exit_with_a_message(capsys):
    assert cli.main(["demo", "--max-new-tokens", "0"]) == 2
    assert "--max-new-tokens" in capsys.readouterr().err
    assert cli.main(["generate", "--prompt", "x", "--budget", "-1"]) == 2
    assert cli.main(["demo", "--max-budget", "-1"]) == 2
    assert "--max-budget must be an int in [0, 65536], got -1" in capsys.readouterr().err
    assert cli.main(["demo", "--count", "0"]) == 2
    with pytest.raises(SystemExit):
        cli.main(["demo", "--dtype", "float16"])
    with pytest.raises(SystemExit):
        cli.main(["generate"])  # --prompt is required


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--depth", "1"], "--depth must be in [2, 64]"),
        (["--budget", "100000"], "--budget must be an int in [0, 65536]"),
        (["--min-draft-score", "-1"], "--min-draft-score must be a finite number >= 0"),
        (["--min-draft-score", "nan"], "--min-draft-score"),
        (["--threads", "0"], "--threads must be in [1, "),
        (["--sample", "--top-p", "0"], "--top-p must be in (0, 1]"),
        (["--sample", "--temperature", "0"], "--temperature must be a finite number > 0"),
        (["--sample", "--temperature", "inf"], "--temperature must be a finite number > 0"),
        (["--top-k", "-1"], "--top-k must be >= 0"),
        (["--repetition-penalty", "0"], "--repetition-penalty must be a finite number > 0"),
    ],
)
def test_bad_values_are_refused_before_the_model_loads(argv, message, monkeypatch, capsys):
    def no_load(*a, **k):
        raise AssertionError("the model must not load for bad arguments")

    monkeypatch.setattr("lookahead.models.load_model", no_load)
    assert cli.main(["generate", "--prompt", "x", *argv]) == 2
    assert message in capsys.readouterr().err


def test_more_bad_values_refused_before_the_model_loads(tmp_path, monkeypatch, capsys):
    def no_load(*a, **k):
        raise AssertionError("the model must not load for bad arguments")

    monkeypatch.setattr("lookahead.models.load_model", no_load)
    assert cli.main(["generate", "--prompt", ""]) == 2
    assert "--prompt is empty" in capsys.readouterr().err
    assert cli.main(["generate", "--prompt", "x", "--seed", "-1"]) == 2
    assert "--seed must be in [0, 2**64)" in capsys.readouterr().err
    assert cli.main(["generate", "--prompt", "x", "--stop", "a", "--stop", ""]) == 2
    assert "--stop must not be empty" in capsys.readouterr().err
    afile = tmp_path / "afile"
    afile.write_text("")
    with pytest.raises(SystemExit, match="cannot write"):
        cli.main(["demo", "--json", str(afile / "demo.json")])
    from benchmarks import e2e

    with pytest.raises(SystemExit):
        e2e.main(["--budget", "-1"])
    with pytest.raises(SystemExit):
        e2e.main(["--max-new-tokens", "0"])
    with pytest.raises(SystemExit):
        e2e.main(["--per-category", "0"])
    with pytest.raises(SystemExit):
        e2e.main(["--recycle", "all"])


def test_recycle_reaches_the_engine(monkeypatch):
    seen = []
    from lookahead import commands

    monkeypatch.setattr(commands, "generate", lambda args: seen.append(args.recycle) or 0)
    for flag in ("off", "on", "path"):
        assert cli.main(["generate", "--prompt", "x", "--recycle", flag]) == 0
    from lookahead.hf.recycling import RECYCLE_MODES

    assert [RECYCLE_MODES[f] for f in seen] == [False, True, "path"]
    with pytest.raises(SystemExit):
        cli.main(["generate", "--prompt", "x", "--recycle", "yes"])


def test_interrupt_exits_130(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr("lookahead.commands.generate", interrupted)
    assert cli.main(["generate", "--prompt", "x"]) == 130
    assert "interrupted" in capsys.readouterr().err


def test_prompt_from_stdin(monkeypatch):
    import io

    seen = {}
    monkeypatch.setattr("sys.stdin", io.StringIO("a prompt from stdin"))
    monkeypatch.setattr(
        "lookahead.commands.generate", lambda args: seen.setdefault("prompt", args.prompt) and 0
    )
    assert cli.main(["generate", "--prompt", "-"]) == 0
    assert seen["prompt"] == "a prompt from stdin"


@pytest.mark.parametrize("device", ["mps", "meta", "xla", "cuda:7", "gpu"])
def test_unsupported_devices_are_one_line(device, capsys):
    assert cli.main(["generate", "--prompt", "x", "--device", device]) == 1
    err = capsys.readouterr().err
    assert err.startswith("lookahead: ") and "Traceback" not in err and "device" in err


def test_runtime_errors_are_one_line(tmp_path, capsys):
    missing = str(tmp_path / "no-such-model")
    assert cli.main(["generate", "--prompt", "x", "--model", missing]) == 1
    err = capsys.readouterr().err
    assert err.startswith("lookahead: ") and "Traceback" not in err and missing in err
    assert cli.main(["demo", "--prompts", str(tmp_path / "none.jsonl")]) == 1
    assert "none.jsonl" in capsys.readouterr().err


def test_demo_on_a_prompt_file_runs_every_prompt_by_default(tmp_path, monkeypatch, capsys):
    model, tok = tiny_model("llama", seed=5), tiny_tokenizer()
    monkeypatch.setattr("lookahead.models.load_model", lambda *a, **k: (model, tok))
    own = tmp_path / "p.jsonl"
    own.write_text('{"prompt": "abcabcabc"}\n{"prompt": "xyzxyz", "category": "k"}\n')
    out = tmp_path / "o.json"
    argv = ["demo", "--prompts", str(own), "--max-new-tokens", "6", "--json", str(out)]
    assert cli.main(argv) == 0
    assert [r["category"] for r in json.loads(out.read_text())["rows"]] == ["custom", "k"]


def test_generate_without_a_chat_template_uses_the_prompt_as_is(monkeypatch, capsys):
    model, tok = tiny_model("llama", seed=6), tiny_tokenizer()
    assert not getattr(tok, "chat_template", None)
    monkeypatch.setattr("lookahead.models.load_model", lambda *a, **k: (model, tok))
    assert cli.main(["generate", "--prompt", "abcabc", "--max-new-tokens", "4"]) == 0
    assert "no chat template" in capsys.readouterr().err


def test_parser_defaults():
    args = cli.build_parser().parse_args(["demo"])
    assert args.dtype == "auto" and args.device == "cpu"
    assert args.categories is None  # rag,summarization of the sample; all of a --prompts file
    assert args.budget is None and args.max_budget is None and not args.single_branch
    # generate's sampling options left unset follow the model's generation config (as HF).
    gen = cli.build_parser().parse_args(["generate", "--prompt", "x"])
    assert (gen.sample, gen.temperature, gen.top_k, gen.top_p, gen.repetition_penalty) == (
        (None,) * 5
    )
    assert cli.build_parser().parse_args(["generate", "--prompt", "x", "--greedy"]).sample is False
    assert cli.build_parser().parse_args(["generate", "--prompt", "x", "--sample"]).sample is True
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["generate", "--prompt", "x", "--sample", "--greedy"])


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
    bad_lines = ("[1, 2]", '"hi"', '{"turns": "abc"}', '{"turns": []}')
    categories = [f'{{"prompt": "a", "category": {c}}}' for c in ("null", "[1]", "2", '""')]
    categories.append('{"prompt": "a", "category": "overall"}')
    for bad in (*bad_lines, *categories):
        own.write_text(bad + "\n")
        with pytest.raises(ValueError, match="line 1" if bad in bad_lines else "'category' must"):
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
    summary = demo_table.summarize(rows)
    assert [s["category"] for s in summary] == ["a", "b", "overall"]
    text = demo_table.format_summary(summary, "float32")
    assert "median speedup" in text and "mean: plain" in text and "[float32]" in text
    assert demo_table.busy_note(1.9, 2) is None and demo_table.busy_note(2.0, 2) is None
    assert "load average 3.5 on 2 cores" in demo_table.busy_note(3.5, 2)
    assert "yes" in demo_table.format_row(rows[0])
    demo_table.plot(rows, summary, str(tmp_path / "p.png"), "float32")
    assert (tmp_path / "p.png").stat().st_size > 1000
    # A generation config that asks for sampling: both sides of the demo stay greedy.
    model.generation_config.do_sample, model.generation_config.temperature = True, 0.7
    assert all(r.identical for r in demo.run(model, tok, prompts, max_new_tokens=12, budget=6))


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
    assert out["max_budget"] == 12 and {"command", "date", "git", "versions"} <= set(out)
    row = out["rows"][0]
    assert row["question_id"] == 7 and row["identical"] is True
    for key in ("plain_s", "lookahead_s", "mean_accepted", "lookahead_tokens", "category"):
        assert key in row
    assert "overall" in capsys.readouterr().out


def test_demo_explains_forks_and_fails_on_a_wrong_token(tmp_path, monkeypatch, capsys):
    from lookahead.hf import LookaheadGenerator

    model, tok = tiny_model("llama", seed=5), tiny_tokenizer()
    monkeypatch.setattr("lookahead.models.load_model", lambda *a, **k: (model, tok))
    own = tmp_path / "p.jsonl"
    own.write_text(
        '{"question_id": 1, "category": "c", "turns": ["abcabcabcabc"]}\n'
        '{"question_id": 2, "category": "c", "turns": ["xyzxyzxyz"]}\n'
    )
    args = SimpleNamespace(
        categories="", prompts=str(own), count=2, model=None, dtype="float32",
        max_new_tokens=10, budget=None, max_budget=None, depth=8, single_branch=False,
        json=str(tmp_path / "out.json"), plot=None, no_pld=False,
    )  # fmt: skip
    assert demo.main(args) == 0
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["rounding_bound"] < 1e-3 and out["pld_tokens"] == demo.PLD_TOKENS
    assert out["peer"] == "prompt lookup"
    assert all(r["verdict"] == "identical" and r["peer_identical"] for r in out["rows"])
    summary = {s["category"]: s for s in out["summary"]}["overall"]
    assert (summary["identical"], summary["near_tie"], summary["bug"]) == (2, 0, 0)
    assert "median_speedup_vs_peer" in summary and summary["peer_identical"] == 2
    text = capsys.readouterr().out
    assert "prompt lookup" in text and "near-tie forks 0, wrong 0" in text and "vs PLD" in text

    # A planted wrong token in lookahead's output: the demo names it a bug and exits 1.
    orig = LookaheadGenerator.generate

    def wrong(self, *a, **k):
        res = orig(self, *a, **k)
        if len(res.ids) > 3:
            res.ids[3] = (res.ids[3] + 1) % model.config.vocab_size
        return res

    monkeypatch.setattr(LookaheadGenerator, "generate", wrong)
    args.no_pld = True
    assert demo.main(args) == 1
    captured = capsys.readouterr()
    assert "fork @3, BUG" in captured.out and "This is a bug" in captured.err
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["pld_tokens"] is None and out["peer"] is None
    assert out["rows"][0]["verdict"] == "bug" and out["rows"][0]["peer_tokens"] is None
    assert out["rows"][0]["fork"]["position"] == 3


def test_calibrate_measures_again_and_prints_the_curve(tmp_path, monkeypatch, capsys):
    model, tok = tiny_model("llama"), tiny_tokenizer()
    monkeypatch.setattr("lookahead.models.load_model", lambda *a, **k: (model, tok))
    monkeypatch.setenv("LOOKAHEAD_COST_DIR", str(tmp_path))
    for _ in range(2):  # a second run measures again (it is what calibrate is for)
        assert cli.main(["calibrate", "--dtype", "float32"]) == 0
        out, err = capsys.readouterr()
        assert "measuring" in err and "verify cost by rows (float32, cpu" in out
        assert "128 cached tokens: W=1" in out
    assert len(list(tmp_path.iterdir())) == 1
    assert cli.main(["calibrate", "--threads", "0"]) == 2
