"""`lookahead.llamacpp.server`: the `llama-server` runner's failures and teardown, on small
stand-in binaries (the real binary runs in `test_llamacpp_demo_peer.py`)."""

from __future__ import annotations

import os
import stat
import sys

import pytest
from lookahead.errors import ServerError
from lookahead.llamacpp import server


def _script(tmp_path, body: str):
    path = tmp_path / "llama-server"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_server_that_exits_at_start_up_says_why_with_its_log(tmp_path):
    binary = _script(tmp_path, 'echo "llama_model_load: error loading model: bad magic"; exit 3')
    s = server.Server(binary, tmp_path / "m.gguf", server.SETTINGS["plain"], threads=1)
    with s, pytest.raises(ServerError, match="exited with status 3 at start-up.*bad magic"):
        s.wait_ready(timeout=30)
    assert not s.log.exists()  # its own log, removed on close


def test_a_server_never_ready_is_killed_even_if_it_ignores_sigterm(tmp_path, monkeypatch):
    monkeypatch.setattr(server, "STOP_TIMEOUT_S", 0.5)
    binary = _script(tmp_path, "trap '' TERM; echo loading; exec sleep 60")
    log = tmp_path / "server.log"
    with pytest.raises(ServerError, match=r"not ready in 1 s; the end of its log: loading"):
        with server.Server(binary, tmp_path / "m.gguf", [], threads=1, log=log) as s:
            s.wait_ready(timeout=1)
    assert s.proc.returncode == -9 and _gone(s.proc.pid)
    assert log.read_text() == "loading\n"  # a log it was given is kept
    s.close()  # twice: nothing more to do


def test_binary_problems_are_one_line(tmp_path):
    assert "no such file" in server.binary_problem(tmp_path / "none")
    assert "is not a file" in server.binary_problem(tmp_path)
    (tmp_path / "f").write_text("")
    assert "is not executable" in server.binary_problem(tmp_path / "f")
    assert server.binary_problem(_script(tmp_path, "exit 0")) is None
    assert server.DEFAULT_SPECULATOR in server.SPECULATORS and "plain" not in server.SPECULATORS


FAKE_SERVER = """
import json, os, signal, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

class Handler(BaseHTTPRequestHandler):
    def _answer(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._answer(200, {"status": "ok"})

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if req["prompt"] == [11]:  # a crash mid-forward, as ggml's AMX kernels crash here
            print("ggml_compute_forward: about to crash", flush=True)
            os.kill(os.getpid(), signal.SIGSEGV)
        if req["prompt"] == [12]:  # hangs up without an answer, and lives on
            self.close_connection = True
            return
        if req["prompt"] == [0]:
            return self._answer(400, {"error": "the prompt is too long"})
        if req["prompt"] == [1]:
            return self._answer(200, {"content": "no tokens"})
        self._answer(200, {"tokens": req["prompt"][::-1][: req["n_predict"]], "request": req,
                           "timings": {"prompt_ms": 5.0, "predicted_ms": 20.0}})

    def log_message(self, *a):
        pass

HTTPServer(("127.0.0.1", int(sys.argv[sys.argv.index("--port") + 1])), Handler).serve_forever()
"""


def test_completions_are_greedy_token_ids_timed_by_the_server(tmp_path, monkeypatch):
    monkeypatch.setattr(server, "CRASH_WAIT_S", 0.2)
    (tmp_path / "fake.py").write_text(FAKE_SERVER)
    binary = _script(tmp_path, f'exec "{sys.executable}" "{tmp_path / "fake.py"}" "$@"')
    with server.Server(binary, "m.gguf", server.SETTINGS["ngram-mod"], threads=2, n_ctx=512) as s:
        s.wait_ready(timeout=30)
        args = s.proc.args  # the engine's settings
        assert args[args.index("-fa") + 1] == "off" and args[args.index("-ub") + 1] == "128"
        assert s.run([5, 6, 7], 2) == ([7, 6], 0.025)
        req = s.complete([5], 3)["request"]
        assert req == {"prompt": [5], "n_predict": 3, "temperature": 0, "cache_prompt": False,
                       "return_tokens": True}  # fmt: skip
        with pytest.raises(ServerError, match="answered 400: .*the prompt is too long"):
            s.run([0], 2)
        with pytest.raises(ServerError, match="lacks tokens or timings"):
            s.run([1], 2)
        with pytest.raises(ServerError, match="did not answer: RemoteDisconnected"):
            s.run([12], 2)
        # a server that dies mid-request: its status, its log, and what to do about a crash
        with pytest.raises(ServerError, match=r"exited with status -11 during a request.*about "
                           r"to crash.*AMX.*make llama-server"):  # fmt: skip
            s.run([11], 2)
    assert _gone(s.proc.pid)
