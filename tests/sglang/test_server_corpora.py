"""Corpora and warm restarts on real SGLang 0.5.23 CPU servers serving LOOKAHEAD.

Servers as in `test_server_cpu.py` (`cpu_server.py`: subprocess on 127.0.0.1, bounded
start-up, torn down). The tiny random model's answers are its own: a corpus "holds the
answer" when it is built from what a server without speculation answered. Every greedy
output must equal that server's, with or without a corpus, before and after a restart.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading

import pytest

pytest.importorskip("sglang", reason="needs sglang==0.5.23: requirements/sglang-test.txt")

from cpu_server import CpuServer, ServerFailed, save_tiny_model  # noqa: E402

WIDTH = 8
LOOKAHEAD = ["--speculative-algorithm", "LOOKAHEAD", "--speculative-num-draft-tokens", str(WIDTH)]
CORPUS_FLAG = "--speculative-ngram-external-corpus-path"
# Every step verifies the whole tree: the random model repeats itself too rarely for the
# sizer to keep verifying drafts, and these tests count accepted tokens.
FULL_WIDTH = {"max_verify_rows": 64, "stats_interval_s": 0.2}
# Prompts the corpora answer (A) and prompts for the live corpus (B); little repetition.
PROMPTS_A = ["Q: where do the quiet rivers go? A:", "Tell me about purple mountains", "Hi"]
PROMPTS_B = ["Describe a small red fox", "What is seven times nine?", "Sing"]
MAX_NEW = 48


def accepted(meta: dict) -> int:
    return int(meta.get("spec_num_correct_drafts", 0))


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("llama"), "llama")


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    return tmp_path_factory.mktemp("corpus_logs")


@pytest.fixture(scope="module")
def answers(model, logs):
    """Each prompt's greedy answer without speculation: output ids and text."""
    with CpuServer(model, [], logs / "plain.log") as s:
        return {
            p: s.generate(p, max_new_tokens=MAX_NEW, ignore_eos=True) for p in PROMPTS_A + PROMPTS_B
        }


def run(server: CpuServer, prompts: list[str], answers: dict, **params) -> int:
    """Generates every prompt, checks each output equals no speculation; returns the
    accepted draft tokens."""
    total = 0
    for p in prompts:
        out = server.generate(p, max_new_tokens=MAX_NEW, ignore_eos=True, **params)
        assert out["output_ids"] == answers[p]["output_ids"], (p, server.tail())
        total += accepted(out["meta_info"])
    return total


@pytest.fixture(scope="module")
def cold(model, logs, answers, tmp_path_factory):
    """A LOOKAHEAD server without corpus, saving at shutdown: its accepted tokens on A, and
    the save file its SIGTERM left."""
    save = tmp_path_factory.mktemp("warm") / "trie.bin"
    env = {"LOOKAHEAD_CONFIG": json.dumps({**FULL_WIDTH, "save": str(save)})}
    server = CpuServer(model, LOOKAHEAD, logs / "cold.log", env=env)
    with server:
        got = run(server, PROMPTS_A, answers)
        # SIGTERM to the launcher alone, as a process manager sends it: SGLang drains, then
        # asks the scheduler to exit, which saves.
        os.kill(server.proc.pid, signal.SIGTERM)
        server.proc.wait(timeout=120)
    log = server.log()
    assert "lookahead: saved the trie (shutdown)" in log, server.tail()
    return {"accepted": got, "save": save, "log": log}


def test_a_start_up_corpus_raises_acceptance_and_keeps_outputs(
    model, logs, answers, cold, tmp_path
):
    corpus = tmp_path / "answers.jsonl"
    corpus.write_text("".join(json.dumps(p + answers[p]["text"]) + "\n" for p in PROMPTS_A))
    env = {"LOOKAHEAD_CONFIG": json.dumps(FULL_WIDTH)}
    args = LOOKAHEAD + [CORPUS_FLAG, str(corpus)]
    with CpuServer(model, args, logs / "corpus.log", env=env) as server:
        listed = server.get("/list_external_corpora")
        assert listed["success"] and list(listed["corpus_token_counts"]) == [str(corpus)]
        got = run(server, PROMPTS_A, answers)
    assert got > cold["accepted"], (got, cold["accepted"])


def test_restart_with_load_drafts_from_the_previous_run(model, logs, answers, cold):
    env = {"LOOKAHEAD_CONFIG": json.dumps({**FULL_WIDTH, "load": str(cold["save"])})}
    with CpuServer(model, LOOKAHEAD, logs / "warm.log", env=env) as server:
        first = server.generate(PROMPTS_A[0], max_new_tokens=MAX_NEW, ignore_eos=True)
        assert first["output_ids"] == answers[PROMPTS_A[0]]["output_ids"]
        assert "lookahead: warm start from" in server.log()
        # The previous run answered this prompt: its history drafts the whole answer.
        again = accepted(first["meta_info"])
    assert again >= MAX_NEW // 2, again


def test_corpora_added_and_removed_live_serve_their_tenant_alone(model, logs, answers):
    config = {**FULL_WIDTH, "corpus_scope": "by_id"}
    env = {"LOOKAHEAD_CONFIG": json.dumps(config)}
    args = LOOKAHEAD + ["--speculative-ngram-capacity", "60000"]
    with CpuServer(model, args, logs / "live.log", env=env) as server:
        before = run(server, PROMPTS_B, answers, extra_key="tenant-a")
        docs = [p + answers[p]["text"] for p in PROMPTS_B]
        # Added while other requests decode.
        busy = threading.Thread(target=run, args=(server, PROMPTS_A, answers))
        busy.start()
        added = server.post("/add_external_corpus", {"corpus_id": "tenant-a/b", "documents": docs})
        busy.join()
        assert added["success"] and added["loaded_token_count"] > 0, added
        listed = server.get("/list_external_corpora")["corpus_token_counts"]
        assert listed == {"tenant-a/b": added["loaded_token_count"]}
        with_corpus = run(server, PROMPTS_B, answers, extra_key="tenant-a")
        other = run(server, PROMPTS_B, answers, extra_key="tenant-b")
        assert with_corpus > before and with_corpus > other, (before, with_corpus, other)
        # Bad requests fail alone, with one line, and the server keeps serving.
        for body, line in [
            ({"corpus_id": "tenant-a/b", "documents": docs}, "exists"),
            ({"corpus_id": "no-tenant", "documents": docs}, "EXTRA_KEY/NAME"),
        ]:
            with pytest.raises(ServerFailed, match=line):
                server.post("/add_external_corpus", body)
        # A corpus past the corpora's share of the capacity is cut, and says so.
        rng = random.Random(0)
        big = ["".join(chr(rng.randrange(33, 123)) for _ in range(4000)) for _ in range(40)]
        cut = server.post("/add_external_corpus", {"corpus_id": "tenant-a/big", "documents": big})
        assert cut["success"] and "cut at" in cut["message"], cut
        assert cut["loaded_token_count"] < 160_000
        for cid in ("tenant-a/b", "tenant-a/big"):
            assert server.post("/remove_external_corpus", {"corpus_id": cid})["success"]
        with pytest.raises(ServerFailed, match="no corpus"):
            server.post("/remove_external_corpus", {"corpus_id": "tenant-a/b"})
        assert server.get("/list_external_corpora")["corpus_token_counts"] == {}
        assert run(server, PROMPTS_B, answers, extra_key="tenant-c") >= 0


@pytest.mark.parametrize("what", ["bad_corpus", "damaged_save"])
def test_bad_files_end_start_up_with_one_line(model, logs, cold, tmp_path, what):
    config = dict(FULL_WIDTH)
    args = list(LOOKAHEAD)
    if what == "bad_corpus":
        bad = tmp_path / "bad.jsonl"
        bad.write_text('"ok"\n{"text": 1}\n')
        args += [CORPUS_FLAG, str(bad)]
        line = "Invalid external ngram corpus record at line 2: expected a JSON string."
    else:
        data = bytearray(cold["save"].read_bytes())
        data[len(data) // 2] ^= 0x5A
        damaged = tmp_path / "damaged.bin"
        damaged.write_bytes(bytes(data))
        config["load"] = str(damaged)
        line = "LOOKAHEAD_CONFIG load: "
    server = CpuServer(
        model, args, logs / f"{what}.log", env={"LOOKAHEAD_CONFIG": json.dumps(config)}
    )
    with pytest.raises(ServerFailed, match="server exited with"):
        server.start()
    errors = [ln for ln in server.log().splitlines() if "LookaheadConfigError" in ln]
    assert errors and line in errors[-1], server.tail()


def test_a_corpus_built_offline_loads_at_start_up(model, logs, answers, cold, tmp_path):
    from lookahead.cli import main

    docs = tmp_path / "answers.jsonl"
    docs.write_text("".join(json.dumps(p + answers[p]["text"]) + "\n" for p in PROMPTS_A))
    built = tmp_path / "answers.bin"
    assert main(["corpus", "build", str(docs), "--model", str(model), "-o", str(built)]) == 0
    env = {"LOOKAHEAD_CONFIG": json.dumps({**FULL_WIDTH, "load": str(built)})}
    with CpuServer(model, LOOKAHEAD, logs / "built.log", env=env) as server:
        listed = server.get("/list_external_corpora")["corpus_token_counts"]
        assert list(listed) == ["answers.bin"], server.tail()
        got = run(server, PROMPTS_A, answers)
    assert got > cold["accepted"], (got, cold["accepted"])
