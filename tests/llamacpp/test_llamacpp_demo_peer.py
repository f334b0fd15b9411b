"""The demo's peer column: the table and JSON with a peer (made-up rows), the CLI's refusals
of `--llama-server` / `--llama-spec`, and `lookahead demo --engine llamacpp` beside the real
`llama-server` binary (`make llama-server`) on a tiny GGUF written here."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from lookahead import cli, demo_table
from lookahead.demo_table import DemoRow, Peer
from lookahead.forks import Fork
from lookahead.llamacpp import commands, server

ROOT = Path(__file__).resolve().parents[2]
NGRAM = Peer("ngram", "llama-server ngram-mod-short")


def _row(qid, category, **peer):
    return DemoRow(question_id=qid, category=category, prompt_tokens=10, plain_tokens=20,
                   lookahead_tokens=20, plain_s=1.0, lookahead_s=0.5, steps=10,
                   mean_accepted=1.0, tokens_per_step=2.0, host_overhead=0.02, identical=True,
                   **peer)  # fmt: skip


def test_the_table_and_json_with_a_peer_column(tmp_path, capsys):
    fork = Fork(3, 7, 8, 0.01, 0.5, True)
    rows = [
        _row(1, "rag", peer_tokens=20, peer_s=0.8, peer_identical=True),
        _row(2, "rag", peer_tokens=20, peer_s=0.4, peer_identical=False, peer_fork=fork),
        _row(3, "qa"),  # the peer did not run here
    ]
    head, line = demo_table.format_header(NGRAM), demo_table.format_row(rows[0], peer=NGRAM)
    # right-aligned columns: the peer's tok/s, lookahead's speedup over it, tokens per step
    assert head.index("ngram") + 5 == line.index("25.0") + 4
    assert head.index("vs ngram") + 8 == line.index("1.60x") + 5
    assert head.index("tok/step") + 8 == line.rindex("2.00") + 4 and line.endswith("  yes")
    assert demo_table.format_row(rows[1], peer=NGRAM).endswith(
        "yes (ngram: fork @3, near-tie, margin 0.01)"
    )
    assert demo_table.format_row(rows[2], peer=NGRAM).split()[5:9] == ["-", "40.0", "2.00x", "-"]
    assert "vs" not in demo_table.format_header(None).replace("vs plain", "")
    assert demo_table.format_row(rows[2]).split()[5] == "40.0"  # no peer: no peer columns

    args = SimpleNamespace(json=str(tmp_path / "o.json"), plot=None)
    assert demo_table.show(iter(rows), 3, args, "Q4_1", {"engine": "x"}, 0.5, NGRAM) == 0
    out = json.loads((tmp_path / "o.json").read_text())
    assert out["peer"] == "llama-server ngram-mod-short" and out["engine"] == "x"
    r0, r1 = out["rows"][:2]
    assert (r0["peer_tokens"], r0["peer_tps"], r0["speedup_vs_peer"]) == (20, 25.0, 1.6)
    assert r1["peer_identical"] is False and r1["peer_fork"]["position"] == 3
    assert out["rows"][2]["peer_tps"] is None and out["rows"][2]["speedup_vs_peer"] is None
    by = {s["category"]: s for s in out["summary"]}
    assert by["overall"]["median_speedup_vs_peer"] == pytest.approx(1.2)  # 1.6 and 0.8
    assert by["overall"]["median_peer_speedup"] == pytest.approx(1.875)  # 1.25 and 2.5
    assert by["overall"]["peer_identical"] == 1 and by["rag"]["peer_tps"] == 37.5
    assert "median_speedup_vs_peer" not in by["qa"]
    text = capsys.readouterr().out
    assert "vs ngram" in text and "(1.20x llama-server ngram-mod-short, which gets 1.88x)" in text

    # No peer ran: no peer columns, and the JSON says so.
    assert demo_table.show(iter(rows[2:]), 1, args, "Q4_1", {}, 0.5, None) == 0
    assert json.loads((tmp_path / "o.json").read_text())["peer"] is None
    assert "ngram" not in capsys.readouterr().out


def test_the_speedup_after_the_prompt_is_shown_where_prefill_times_are_known(capsys):
    # plain: 1.0 s, 0.4 of it the prompt (19 tokens after the first in 0.6 s); lookahead:
    # 0.5 s, 0.4 of it the prompt (19 in 0.1 s): 6x after the prompt, 2x in all.
    rows = [_row(1, "rag", plain_prefill_s=0.4, lookahead_prefill_s=0.4), _row(2, "qa")]
    assert rows[0].decode_speedup == pytest.approx(6.0) and rows[0].prefill_share == 0.4
    assert rows[1].decode_speedup is None and rows[1].prefill_share is None
    assert _row(3, "x", plain_prefill_s=1.0, lookahead_prefill_s=0.4).decode_speedup is None
    # On plain's text: 0.4 s of prompt and 0.6 s / 6 after it, 1.0 / 0.5 = 2x, as in all.
    assert rows[0].same_length_speedup == pytest.approx(2.0)
    assert rows[1].same_length_speedup is None
    # A fork whose text runs on to 39 tokens (38 after the first in 0.2 s): 3.25x by tokens a
    # second, the prompt's forward spread over more tokens; on plain's text still 2x.
    longer = dataclasses.replace(rows[0], lookahead_tokens=39, lookahead_s=0.6, identical=False)
    assert longer.speedup == pytest.approx(3.25) and longer.decode_speedup == pytest.approx(6.0)
    assert longer.same_length_speedup == pytest.approx(2.0)
    by = {s["category"]: s for s in demo_table.summarize(rows)}
    assert by["overall"]["median_decode_speedup"] == pytest.approx(6.0)
    assert by["overall"]["median_same_length_speedup"] == pytest.approx(2.0)
    assert "median_decode_speedup" not in by["qa"]
    text = demo_table.format_summary(demo_table.summarize(rows), "Q4_1")
    assert "after the prompt: median speedup 6.00x (the prompt's forward, the same for both, " \
        "is 40% of plain's time); at plain's text length: median speedup 2.00x" in text  # fmt: skip
    assert text.count("after the prompt") == 2  # rag and overall, not qa


def _not_executable(tmp_path):
    path = tmp_path / "llama-server"
    path.write_text("")
    return path


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--llama-server", "/no/such/llama-server"], "no such file (build one with `make llama"),
        (["--llama-server", "."], "is not a file"),
        (["--llama-server", _not_executable], "is not executable"),
        (["--llama-spec", "ngram-bogus"], "--llama-spec must be one of ngram-mod, "),
        (["--llama-spec", "plain"], "--llama-spec must be one of"),
        (["--llama-spec", "ngram-mod"], "--llama-spec needs a llama-server"),
        (["--engine", "hf", "--llama-server", "x"], "--llama-server is the llama.cpp engine's"),
        (["--engine", "hf", "--llama-spec", "ngram-mod"], "--llama-spec is the llama.cpp"),
    ],
)
def test_bad_peer_options_are_refused_before_loading(extra, message, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(server.ENV_BINARY, raising=False)
    extra = [str(x(tmp_path)) if callable(x) else x for x in extra]
    engine = [] if "--engine" in extra else ["--engine", "llamacpp"]
    assert cli.main(["demo", *engine, "--model", "none.gguf", *extra]) == 2
    assert message in capsys.readouterr().err


def test_the_binary_from_the_environment(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(server.ENV_BINARY, str(tmp_path / "gone"))
    assert cli.main(["demo", "--engine", "llamacpp", "--model", "none.gguf"]) == 2
    assert f"${server.ENV_BINARY} " in capsys.readouterr().err
    # only the demo runs a peer: generate and calibrate do not look at it
    args = SimpleNamespace(command="generate", dtype="auto", device="cpu", llama_server=None)
    assert commands.engine_problem(args) is None
    monkeypatch.setenv("COLUMNS", "400")  # wide help: no setting split at a hyphen
    with pytest.raises(SystemExit):
        cli.main(["demo", "--help"])
    text = capsys.readouterr().out
    assert all(s in text for s in server.SPECULATORS) and "$LOOKAHEAD_LLAMA_SERVER" in text


def _llama_server() -> str | None:
    path = os.environ.get(server.ENV_BINARY) or str(
        ROOT / "target" / "llama-server-src" / "build" / "bin" / "llama-server"
    )
    return path if server.binary_problem(path) is None else None


def _processes_with(text: str) -> list:
    """Ids of the processes whose command line holds `text`."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and text.encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:
            pass
    return found


def test_the_demo_beside_the_real_llama_server(tmp_path, monkeypatch, capsys):
    pytest.importorskip("llama_cpp", reason="needs the llamacpp extra (make llamacpp)")
    binary = _llama_server()
    if binary is None:
        pytest.skip("needs llama.cpp's llama-server binary (make llama-server, or "
                    f"${server.ENV_BINARY})")  # fmt: skip
    from tiny_gguf import write_tiny_llama

    gguf = str(write_tiny_llama(tmp_path / "peer.gguf", tokenizer=True, repeat_bias=3.0))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "abc abc abc abc"}\n{"prompt": "xy xy xy", "category": "k"}\n')
    out = tmp_path / "o.json"
    argv = ["demo", "--engine", "llamacpp", "--model", gguf, "--threads", "2", "--prompts",
            str(prompts), "--max-new-tokens", "8", "--llama-server", binary, "--json", str(out)]  # fmt: skip
    assert cli.main(argv) == 0
    got = json.loads(out.read_text())
    assert got["peer"] == "llama-server ngram-mod-short" and got["llama_spec"] == "ngram-mod-short"
    assert got["llama_spec_args"] == server.SETTINGS["ngram-mod-short"]
    for r in got["rows"]:  # fp32: the server's greedy output is plain's, token for token
        assert r["peer_tokens"] == r["plain_tokens"] > 0 and r["peer_identical"] is True
        assert r["peer_s"] > 0 and r["peer_fork"] is None and r["verdict"] != "bug"
    assert got["summary"][-1]["peer_identical"] == 2
    assert "vs ngram" in capsys.readouterr().out
    assert _processes_with(gguf) == []  # the server is gone

    # Ctrl-C while the peer runs: the server is stopped all the same.
    def interrupted(*a):
        raise KeyboardInterrupt

    monkeypatch.setattr(server.Server, "run", interrupted)
    assert cli.main([*argv, "--llama-spec", "ngram-simple"]) == 130
    assert _processes_with(gguf) == []


def test_the_benchmark_reads_a_real_speculators_own_timers(tmp_path):
    pytest.importorskip("llama_cpp", reason="needs the llamacpp extra (make llamacpp)")
    binary = _llama_server()
    if binary is None:
        pytest.skip("needs llama.cpp's llama-server binary (make llama-server, or "
                    f"${server.ENV_BINARY})")  # fmt: skip
    from tiny_gguf import write_tiny_llama

    from benchmarks.llamacpp import speculator_host

    gguf = write_tiny_llama(tmp_path / "spec.gguf", tokenizer=True, repeat_bias=3.0)
    logs = {}
    for name in ("ngram-mod-short", "plain"):  # as the benchmark starts them
        logs[name] = tmp_path / f"{name}.log"
        args = [*server.SETTINGS[name], "-lv", "4"]
        with server.Server(binary, gguf, args, threads=2, log=logs[name]) as s:
            s.wait_ready()
            for _ in range(2):
                assert len(s.complete([1, 5, 6, 7, 5, 6, 7, 5, 6], 8)["tokens"]) == 8
    h = speculator_host(logs["ngram-mod-short"])
    (b, g, a), ms = h["calls"], h["ms"]
    assert b == 2 and g >= 2 and a <= g and all(x >= 0 for x in ms)  # cumulative: both requests
    assert speculator_host(logs["plain"]) is None
