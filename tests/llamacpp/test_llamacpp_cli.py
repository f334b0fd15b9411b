"""`lookahead generate | demo | calibrate --engine llamacpp` on a tiny GGUF written here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from lookahead import cli

pytest.importorskip("llama_cpp", reason="needs the llamacpp extra (make llamacpp)")

from tiny_gguf import write_tiny_llama  # noqa: E402


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "text.gguf"
    return str(write_tiny_llama(path, tokenizer=True, repeat_bias=3.0))


def test_generate_streams_the_text_and_reports_the_steps(gguf, capsys):
    argv = ["generate", "--engine", "llamacpp", "--model", gguf, "--threads", "2",
            "--prompt", "abc abc abc", "--max-new-tokens", "12", "--budget", "4"]  # fmt: skip
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert out.strip() and "12 tokens in" in err and "llama.cpp, text.gguf" in err
    assert "FixedSizer" in err and "(chosen by timing at " in err  # flash: the default
    assert cli.main([*argv, "--flash-attn", "on"]) == 0
    err = capsys.readouterr().err
    assert "flash attention on" in err and "measured" not in err
    assert cli.main([*argv, "--sample", "--temperature", "0.8", "--seed", "4"]) == 0


def test_demo_runs_plain_and_lookahead_on_every_prompt(gguf, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "abc abc abc abc"}\n{"prompt": "xy xy xy", "category": "k"}\n')
    out = tmp_path / "o.json"
    argv = ["demo", "--engine", "llamacpp", "--model", gguf, "--prompts", str(prompts),
            "--max-new-tokens", "16", "--json", str(out)]  # fmt: skip
    assert cli.main(argv) == 0
    got = json.loads(out.read_text())
    assert got["engine"] == "llamacpp" and [r["category"] for r in got["rows"]] == ["custom", "k"]
    assert all(r["verdict"] != "bug" for r in got["rows"])
    assert got["start_up_costs"]["widths"][0] == 1
    choice = got["flash_choice"]  # measured at load, and what every method then ran
    assert got["flash_attn"] == choice["choice"] in ("off", "on")
    assert set(choice["prompt_s"]) == set(choice["forward_s"]) == {"off", "on"}
    # read at the prompts' median length: the band it drafted in, not the warm-up's
    learnt = [ln for ln in capsys.readouterr().out.splitlines() if "learnt from this run" in ln]
    assert len(learnt) == 1 and "forwards kept in its band" in learnt[0]
    assert int(learnt[0].split(" forwards kept")[0].rsplit("(", 1)[1]) > 0
    # a fixed budget: no cost curve to show, the same table
    assert cli.main([*argv, "--budget", "4"]) == 0
    assert json.loads(out.read_text())["start_up_costs"] is None
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"prompt": "ab " * 400}) + "\n")
    assert cli.main([*argv[:5], "--prompts", str(long), "--max-new-tokens", "16"]) == 1
    assert "exceeds the context" in capsys.readouterr().err


def test_calibrate_prints_the_measured_curve(gguf, capsys):
    assert cli.main(["calibrate", "--engine", "llamacpp", "--model", gguf]) == 0
    out = capsys.readouterr().out
    assert "W=1" in out and "-token prompt and 128 forwards of 1 and 4 rows" in out
    assert "earlier load" not in out  # timed again, whatever was kept


# What the `llamacpp` extra installs without the `hf` one: no torch, transformers or gguf.
NOT_IN_THE_LLAMACPP_EXTRA = ("torch", "transformers", "gguf", "accelerate", "triton")


def _cli_without_hf(argv: list, tmp_path) -> subprocess.CompletedProcess:
    """`lookahead ARGV` in a Python where the `hf` extra's packages cannot be imported."""
    code = (
        "import sys, runpy\n"
        f"for m in {NOT_IN_THE_LLAMACPP_EXTRA!r}:\n    sys.modules[m] = None\n"
        f"sys.argv = ['lookahead', *{argv!r}]\n"
        "runpy.run_module('lookahead.cli', run_name='__main__')\n"
    )
    env = {**os.environ, "LOOKAHEAD_COST_DIR": str(tmp_path)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=env)  # fmt: skip


def test_greedy_decoding_and_the_demo_need_no_torch(gguf, tmp_path):
    argv = ["generate", "--engine", "llamacpp", "--model", gguf, "--threads", "2",
            "--prompt", "abc abc abc", "--max-new-tokens", "12"]  # fmt: skip
    got = _cli_without_hf(argv, tmp_path)
    assert got.returncode == 0, got.stderr[-2000:]
    assert "12 tokens in" in got.stderr and "CostAwareSizer" in got.stderr
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "abc abc abc abc"}\n')
    demo = ["demo", "--engine", "llamacpp", "--model", gguf, "--threads", "2",
            "--prompts", str(prompts), "--max-new-tokens", "8"]  # fmt: skip
    got = _cli_without_hf(demo, tmp_path)
    assert got.returncode == 0, got.stderr[-2000:]
    assert "overall" in got.stdout
    # sampling runs lookahead.kernels' exact tree sampler: torch, asked for by name
    got = _cli_without_hf([*argv, "--sample"], tmp_path)
    assert got.returncode == 1 and "sampling on the llama.cpp engine needs torch" in got.stderr


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--dtype", "float32"], "--dtype is the HF engine's"),
        (["--device", "cuda"], "runs on the CPU"),
        (["--recycle", "on"], "--recycle is not in the llama.cpp engine"),
        (["--repetition-penalty", "1.2"], "--repetition-penalty is not in"),
    ],
)
def test_what_the_engine_cannot_do_is_refused_before_loading(gguf, extra, message, capsys):
    argv = ["generate", "--engine", "llamacpp", "--model", gguf, "--prompt", "x", *extra]
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_flash_attention_is_the_llama_cpp_engines_knob(capsys):
    assert cli.main(["generate", "--prompt", "x", "--flash-attn", "on"]) == 2
    assert "--flash-attn is the llama.cpp engine's" in capsys.readouterr().err


def test_a_missing_gguf_is_one_line(tmp_path, capsys):
    argv = ["generate", "--engine", "llamacpp", "--model", str(tmp_path / "no.gguf"),
            "--prompt", "x"]  # fmt: skip
    assert cli.main(argv) == 1
    assert "GGUF file not found" in capsys.readouterr().err
