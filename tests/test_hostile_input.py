"""Hostile input to the `lookahead` command and the generate API: undecodable text, closed or
broken stdout, unwritable outputs, empty prompts, prompts past the context, bad GGUF files.

Each case ends in a clear one-line error (or a warning), never a traceback, and before any
slow work where it can be known up front.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from lookahead import cli, demo, models, output
from lookahead.errors import InvalidInput, LookaheadError
from lookahead.hf import LookaheadGenerator, generate
from tiny_models import tiny_model, tiny_tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _no_load(*a, **k):
    raise AssertionError("the model must not load")


@pytest.fixture
def tiny_loaded(monkeypatch):
    """`load_model` gives a tiny model (with no EOS, so output runs to max_new_tokens)."""
    model, tok = tiny_model("llama", seed=6), tiny_tokenizer()
    model.generation_config.eos_token_id = None
    monkeypatch.setattr("lookahead.models.load_model", lambda *a, **k: (model, tok))
    return model, tok


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny HF folder on disk, for the command run as a process."""
    folder = tmp_path_factory.mktemp("tiny-model")
    model = tiny_model("llama", seed=6)
    model.generation_config.eos_token_id = None
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


def _run_cli(args, **kw):
    """`python -m lookahead.cli ARGS` as a process: (returncode, stderr)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "lookahead.cli", *args],
        stderr=subprocess.PIPE,
        env=env,
        timeout=300,
        **kw,
    )
    return proc.returncode, proc.stderr.decode("utf-8", "replace")


def _one_line_error(err: str, *needles: str) -> None:
    lines = [x for x in err.replace("\r", "\n").splitlines() if x.startswith("lookahead: ")]
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert len(lines) >= 1, err
    assert any(all(n in x for n in needles) for x in lines), err


# -- 1: undecodable text --------------------------------------------------------------------
def test_api_refuses_lone_surrogates_with_invalid_input():
    model, tok = tiny_model("llama", seed=1), tiny_tokenizer()
    with pytest.raises(InvalidInput, match="not valid UTF-8: undecodable byte 0xff at character 3"):
        generate(model, "abc\udcff", tok, max_new_tokens=2)
    with pytest.raises(ValueError, match="lone surrogate U\\+D800"):  # InvalidInput is one
        LookaheadGenerator(model, tok).generate("a\ud800b", max_new_tokens=2)
    with pytest.raises(LookaheadError, match="stop string"):
        generate(model, "abc", tok, max_new_tokens=2, stop_strings=["x\udcff"])
    assert len(generate(model, "abc", tok, max_new_tokens=2).ids) >= 1  # plain text still runs


def test_cli_refuses_an_undecodable_argv_prompt(monkeypatch, capsys):
    # What Python makes of the argv byte 0xff (surrogateescape).
    monkeypatch.setattr("lookahead.models.load_model", _no_load)
    assert cli.main(["generate", "--prompt", "ab\udcffc", "--no-chat"]) == 2
    _one_line_error(capsys.readouterr().err, "--prompt is not valid UTF-8", "0xff")
    assert cli.main(["generate", "--prompt", "abc", "--stop", "\udcfe"]) == 2
    _one_line_error(capsys.readouterr().err, "--stop is not valid UTF-8")


@pytest.mark.parametrize("errors", ["surrogateescape", "strict"])
def test_cli_refuses_an_undecodable_stdin_prompt(errors, monkeypatch, capsys):
    # Python reads stdin with surrogateescape under the C locale or UTF-8 mode, else strictly.
    stdin = io.TextIOWrapper(io.BytesIO(b"ab\xffc"), encoding="utf-8", errors=errors)
    monkeypatch.setattr("sys.stdin", stdin)
    monkeypatch.setattr("lookahead.models.load_model", _no_load)
    assert cli.main(["generate", "--prompt", "-", "--no-chat"]) == 2
    _one_line_error(capsys.readouterr().err, "the prompt read from stdin is not valid", "0xff")
    monkeypatch.setattr("sys.stdin", None)  # started with stdin closed (`<&-`)
    assert cli.main(["generate", "--prompt", "-"]) == 2
    _one_line_error(capsys.readouterr().err, "stdin is closed")


def test_cli_refuses_undecodable_argv_bytes_as_a_process(model_dir):
    rc, err = _run_cli(
        ["generate", "--model", str(model_dir), "--prompt", b"ab\xffc", "--no-chat"],
        stdout=subprocess.DEVNULL,
    )
    assert rc == 2
    _one_line_error(err, "--prompt is not valid UTF-8: undecodable byte 0xff")


def test_demo_refuses_a_prompt_file_with_a_lone_surrogate(tmp_path):
    own = tmp_path / "p.jsonl"
    own.write_text('{"prompt": "ab\\udcffc"}\n')  # valid JSON, not valid text
    with pytest.raises(ValueError, match="line 1: the prompt is not valid UTF-8"):
        demo.load_prompts(own, None, None)


# -- 2: closed stdout, broken pipe ----------------------------------------------------------
@pytest.mark.parametrize("command", [["generate", "--prompt", "abc"], ["demo"]])
def test_closed_stdout_is_one_line_before_the_model_loads(command, monkeypatch, capsys):
    monkeypatch.setattr("lookahead.models.load_model", _no_load)
    monkeypatch.setattr("sys.stdout", None)  # what Python makes of `>&-`
    assert cli.main(command) == 1
    _one_line_error(capsys.readouterr().err, "stdout is closed")


def test_closed_stdout_as_a_process(model_dir):
    argv = ["generate", "--model", str(model_dir), "--prompt", "abc", "--max-new-tokens", "4"]
    rc, err = _run_cli(argv, stdout=subprocess.DEVNULL, preexec_fn=lambda: os.close(1))
    assert rc == 1
    _one_line_error(err, "stdout is closed")


class _GoneReader(io.StringIO):
    """A stdout whose reader went away, without a file descriptor (a wrapped stream)."""

    def write(self, s):
        raise BrokenPipeError(32, "Broken pipe")

    def fileno(self):
        raise io.UnsupportedOperation("fileno")


def test_broken_pipe_on_a_stdout_without_a_descriptor_exits_quietly(
    tiny_loaded, monkeypatch, capsys
):
    monkeypatch.setattr("sys.stdout", _GoneReader())
    argv = ["generate", "--prompt", "abcabc", "--no-chat", "--max-new-tokens", "8"]
    assert cli.main(argv) == 1
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("command", ["generate", "demo"])
def test_broken_pipe_as_a_process_exits_quietly(command, model_dir, tmp_path):
    # `| head -c1` made certain: the reader is gone before the first write.
    if command == "generate":
        argv = ["generate", "--prompt", "abcabc", "--no-chat", "--max-new-tokens", "40"]
    else:
        prompts = tmp_path / "p.jsonl"
        prompts.write_text('{"prompt": "abcabc"}\n')
        argv = ["demo", "--prompts", str(prompts), "--max-new-tokens", "8"]
    read, write = os.pipe()
    os.close(read)
    try:
        rc, err = _run_cli([*argv, "--model", str(model_dir)], stdout=write)
    finally:
        os.close(write)
    assert rc == 1, err
    assert "Traceback" not in err and "Exception ignored" not in err and "Error" not in err, err


# -- 3: outputs that cannot be written ------------------------------------------------------
def test_demo_json_onto_an_unwritable_file_fails_before_any_prompt(tmp_path, monkeypatch):
    monkeypatch.setattr("lookahead.models.load_model", _no_load)
    # /proc takes no new file whatever the permission bits say (root passes them all).
    for dest in ("/proc/version", "/proc/lookahead-demo.json"):
        with pytest.raises(SystemExit, match=f"cannot write {dest}"):
            cli.main(["demo", "--json", dest])
    if os.geteuid() != 0:  # permission bits bind only others than root
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        try:
            with pytest.raises(SystemExit, match="cannot write"):
                cli.main(["demo", "--json", str(ro / "demo.json")])
        finally:
            ro.chmod(0o755)


def test_checked_outputs_leave_nothing_and_write_whole(tmp_path):
    dest = tmp_path / "out" / "demo.json"
    output.check_outputs(dest)
    assert [p.name for p in dest.parent.iterdir()] == []  # the probe is gone, nothing made
    output.write_output(dest, "one")
    output.write_output(dest, "two")
    assert dest.read_text() == "two" and [p.name for p in dest.parent.iterdir()] == ["demo.json"]
    link = tmp_path / "link.json"
    link.symlink_to(dest)
    output.write_output(link, "three")  # the target is replaced, the link kept
    assert link.is_symlink() and dest.read_text() == "three"
    # A device is written in place, never renamed over.
    output.check_outputs("/dev/null")
    output.write_output("/dev/null", "x")
    assert Path("/dev/null").is_char_device()


# -- 4: empty prompts -----------------------------------------------------------------------
def test_demo_refuses_an_empty_prompt_as_generate_does(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("lookahead.models.load_model", _no_load)
    own = tmp_path / "p.jsonl"
    for line in ('{"prompt": ""}', '{"turns": ["", "b"]}'):
        own.write_text('{"prompt": "fine"}\n' + line + "\n")
        with pytest.raises(ValueError, match="line 2: the prompt is empty"):
            demo.load_prompts(own, None, None)
        assert cli.main(["demo", "--prompts", str(own)]) == 1  # before the model loads
        _one_line_error(capsys.readouterr().err, "line 2: the prompt is empty")
    assert cli.main(["generate", "--prompt", ""]) == 2
    _one_line_error(capsys.readouterr().err, "--prompt is empty")
    with pytest.raises(SystemExit):
        cli.main(["demo", "--help"])
    assert "an empty prompt is refused (as by generate)" in " ".join(
        capsys.readouterr().out.split()
    )


# -- 5: prompts past the model's context ----------------------------------------------------
def test_a_prompt_longer_than_the_context_is_refused_before_the_prefill():
    model, tok = tiny_model("llama", seed=2, max_position_embeddings=16), tiny_tokenizer()
    forwards = []
    model.register_forward_pre_hook(lambda *a: forwards.append(1))
    gen = LookaheadGenerator(model, tok)
    with pytest.raises(InvalidInput, match="20 tokens, more than the model's context of 16"):
        gen.generate(list(range(2, 22)), max_new_tokens=2)
    with pytest.raises(InvalidInput, match="context of 16"):
        gen.generate("a" * 17, max_new_tokens=2)
    assert forwards == []
    # One that fits but may run past it: a warning first, and it still runs.
    with pytest.warns(UserWarning, match="exceed the model's context of 16"):
        res = gen.generate(list(range(2, 12)), max_new_tokens=8, eos_token_id=None)
    assert len(res.ids) == 8
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gen.generate(list(range(2, 12)), max_new_tokens=6, eos_token_id=None)  # fits: silent


def test_demo_refuses_a_prompt_past_the_context_before_any_prompt_runs():
    model, tok = tiny_model("llama", seed=2, max_position_embeddings=16), tiny_tokenizer()
    forwards = []
    model.register_forward_pre_hook(lambda *a: forwards.append(1))
    prompts = [
        {"question_id": 1, "category": "a", "turns": ["abc"]},
        {"question_id": 2, "category": "b", "turns": ["x" * 20]},
    ]
    with pytest.raises(InvalidInput, match=r"prompt 2 \(b\) has 20 tokens.*context of 16"):
        list(demo.run(model, tok, prompts, max_new_tokens=4))
    assert forwards == []


def test_rope_scaling_that_extends_the_context_is_counted():
    from lookahead.hf import context_length

    model = tiny_model("llama", seed=2, max_position_embeddings=16)
    assert context_length(model) == 16
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
    model.config.rope_parameters = {**yarn, "rope_theta": 10000.0}
    assert context_length(model) == 64
    # Llama 3.1's kind: max_position_embeddings already counts the scaling.
    model.config.rope_parameters = {**yarn, "original_max_position_embeddings": 4}
    assert context_length(model) == 16


def test_cli_says_a_prompt_is_past_the_context_in_one_line(monkeypatch, capsys):
    model, tok = tiny_model("llama", seed=2, max_position_embeddings=16), tiny_tokenizer()
    monkeypatch.setattr("lookahead.models.load_model", lambda *a, **k: (model, tok))
    assert cli.main(["generate", "--prompt", "a" * 30, "--no-chat"]) == 1
    _one_line_error(capsys.readouterr().err, "InvalidInput", "context of 16")
    assert cli.main(["generate", "--prompt", "abc", "--no-chat", "--max-new-tokens", "20"]) == 0
    _one_line_error(capsys.readouterr().err, "UserWarning", "context of 16")


# -- 6: bad GGUF files ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "content", [b"GGUF\x03\x00\x00\x00 truncated", b"not a gguf file at all" * 8]
)
def test_a_bad_gguf_file_leaves_nothing_behind(content, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LOOKAHEAD_CACHE_DIR", str(tmp_path / "cache"))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(content)
    with pytest.raises(models.ModelLoadError, match=f"cannot convert {bad}"):
        models.resolve_model_path(bad)
    assert list((tmp_path / "cache" / "models").iterdir()) == []  # no lock, no half folder
    assert cli.main(["generate", "--prompt", "x", "--model", str(bad)]) == 1
    _one_line_error(capsys.readouterr().err, "ModelLoadError", "cannot convert")
    assert list((tmp_path / "cache" / "models").iterdir()) == []


def test_a_conversion_failing_half_way_leaves_nothing_behind(tmp_path, monkeypatch):
    import transformers

    monkeypatch.setenv("LOOKAHEAD_CACHE_DIR", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    tiny = tiny_model("llama", seed=1)

    class FullDisk:
        def save_pretrained(self, folder):
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: tiny)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: FullDisk())
    with pytest.raises(models.ModelLoadError, match="No space left on device"):
        models.resolve_model_path(gguf)  # the weights were written, then the tokenizer failed
    assert list((tmp_path / "cache" / "models").iterdir()) == []


def test_removing_the_lock_file_keeps_conversions_exclusive(tmp_path):
    # A waiter that wakes on a lock file its holder removed must not run beside one that
    # opened the path afresh.
    folder = tmp_path / "models" / "m-1"
    inside, overlaps = [], []

    def convert(delay):
        time.sleep(delay)
        with models._converting(folder):
            if inside:
                overlaps.append(1)
            inside.append(1)
            time.sleep(0.15)
            inside.pop()

    threads = [threading.Thread(target=convert, args=(d,)) for d in (0, 0.05, 0.1, 0.17, 0.2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps == []
    assert not (tmp_path / "models" / "m-1.lock").exists()


def test_demo_json_is_valid_after_a_run(tmp_path, tiny_loaded, capsys):
    # The temp-and-rename write keeps the demo's JSON output as before.
    own = tmp_path / "p.jsonl"
    own.write_text('{"prompt": "abcabc"}\n')
    out = tmp_path / "o.json"
    assert (
        cli.main(["demo", "--prompts", str(own), "--max-new-tokens", "4", "--json", str(out)]) == 0
    )
    assert len(json.loads(out.read_text())["rows"]) == 1
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
