"""llama.cpp's own n-gram speculators, which live only in its `llama-server` binary: the
binary as a subprocess, and the settings it is run with (the peer column of `lookahead demo
--engine llamacpp`; `python -m benchmarks llamacpp` runs every setting).

`Server` starts one `llama-server` on 127.0.0.1 (a free port, one slot), waits a bounded
time for it to answer `/health`, sends token ids to `/completion` (greedy, no prompt cache,
the output's token ids back) and always ends it: SIGTERM to its process group, then SIGKILL
after a bounded wait. `make llama-server` builds the binary from the llama.cpp that the
pinned llama-cpp-python vendors (not shipped).
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from lookahead.errors import ServerError
from lookahead.llamacpp.model import DEFAULT_UBATCH

# The binary when no path is given (`lookahead demo --engine llamacpp --llama-server PATH`).
ENV_BINARY = "LOOKAHEAD_LLAMA_SERVER"
# The server's settings: llama.cpp's n-gram speculators at their defaults, and ngram-mod /
# ngram-simple tuned for the short drafts a steep verify cost pays for.
SETTINGS = {
    "plain": ["--spec-type", "none"],
    "ngram-mod": ["--spec-type", "ngram-mod"],
    "ngram-mod-short": ["--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "8",
                        "--spec-ngram-mod-n-min", "2", "--spec-ngram-mod-n-max", "8"],
    "ngram-simple": ["--spec-type", "ngram-simple"],
    "ngram-simple-short": ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "4",
                           "--spec-ngram-simple-size-m", "4"],
    "ngram-map-k": ["--spec-type", "ngram-map-k"],
    "ngram-cache": ["--spec-type", "ngram-cache"],
}  # fmt: skip
SPECULATORS = tuple(s for s in SETTINGS if s != "plain")
# The best on the demo's rag and summarization prompts with the default model's Q4_1 file
# on a Xeon, and the best overall in most runs since (BENCHMARKS.md, section 7.4).
DEFAULT_SPECULATOR = "ngram-mod-short"
START_TIMEOUT_S = 120.0
REQUEST_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 20.0
LOG_TAIL_BYTES = 2000
# How long a server whose connection broke mid-request gets to be seen exiting.
CRASH_WAIT_S = 2.0
# What ended a server that crashed rather than exited.
CRASH_SIGNALS = (-signal.SIGSEGV, -signal.SIGILL, -signal.SIGBUS)
CRASH_HINT = (
    "; a llama-server built natively on a CPU that reports AMX crashes at its first forward "
    "of two or more rows (ggml's AMX kernels, llama.cpp PR #26954): `make llama-server` builds "
    "one without them (llama-server's own --no-repack also keeps them out)"
)


def binary_problem(path: str | os.PathLike, source: str = "--llama-server") -> str | None:
    """What keeps `path` (given as `source`) from being run as llama-server, or None."""
    p = Path(path)
    if not p.exists():
        return f"{source} {str(path)[:200]!r}: no such file (build one with `make llama-server`)"
    if not p.is_file():
        return f"{source} {str(path)[:200]!r} is not a file (a llama-server binary)"
    if not os.access(p, os.X_OK):
        return f"{source} {str(path)[:200]!r} is not executable"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One `llama-server` process running `model` with `args` (a `SETTINGS` value) on
    127.0.0.1, one slot, `threads` threads, a context of `n_ctx`, flash attention as
    `flash_attn` ("off", "on", "auto") and prompts in graphs of `DEFAULT_UBATCH` tokens (as
    `LlamaCppModel` runs them); started here, ready after
    `wait_ready()`, ended by `close()` (a context manager: closed on exit, whatever
    happened). Its output goes to `log` (default: a file of its own, removed on close)."""

    def __init__(
        self, binary, model, args: list, threads: int, n_ctx: int = 4096, log=None,
        flash_attn: str = "off",
    ):  # fmt: skip
        self.binary = Path(binary)
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._own_log = log is None
        if log is None:
            fd, log = tempfile.mkstemp(prefix="llama-server-", suffix=".log")
            os.close(fd)
        self.log = Path(log)
        cmd = [str(self.binary), "-m", str(model), "-t", str(threads), "-tb", str(threads),
               "-c", str(n_ctx), "-fa", flash_attn, "-ub", str(DEFAULT_UBATCH), "-np", "1",
               "--host", "127.0.0.1", "--port", str(self.port), *args]  # fmt: skip
        self._out = open(self.log, "wb")  # noqa: SIM115 (closed in close())
        try:
            # A session of its own: Ctrl-C at the terminal reaches only us, and close() ends
            # the server's whole process group.
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=self._out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        except BaseException:
            self._out.close()
            self._remove_log()
            raise

    def log_tail(self, n: int = LOG_TAIL_BYTES) -> str:
        """The last `n` bytes of the server's output, as text."""
        try:
            with open(self.log, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - n))
                return f.read().decode("utf-8", "replace").strip()
        except OSError:
            return ""

    def _failed(self, what: str) -> ServerError:
        tail = self.log_tail().replace("\n", " | ")
        return ServerError(f"{self.binary.name} {what}; the end of its log: {tail or '(empty)'}")

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        """Returns once the server answers `/health`; ServerError (with the end of its log)
        if it exits or is not ready within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise self._failed(f"exited with status {self.proc.returncode} at start-up")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.25)
        raise self._failed(f"not ready in {timeout:.0f} s")

    def complete(self, ids: list, n: int) -> dict:
        """The server's `/completion` answer for the prompt `ids`: up to `n` greedy tokens,
        no prompt cache, with the output's token ids ("tokens") and "timings"."""
        body = {"prompt": [int(t) for t in ids], "n_predict": n, "temperature": 0,
                "cache_prompt": False, "return_tokens": True}  # fmt: skip
        req = urllib.request.Request(
            self.url + "/completion",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            detail = e.read()[:300].decode("utf-8", "replace")
            raise ServerError(f"{self.binary.name} answered {e.code}: {detail}") from None
        except (OSError, http.client.HTTPException) as e:
            raise self._broken(e) from None

    def _broken(self, e: BaseException) -> ServerError:
        """The error for a request whose connection failed: the server's exit status and
        log when it died (with what to do when it crashed), else what the connection said."""
        try:
            rc = self.proc.wait(timeout=CRASH_WAIT_S)
        except subprocess.TimeoutExpired:
            return ServerError(f"{self.binary.name} did not answer: {e!r}")
        err = self._failed(f"exited with status {rc} during a request")
        if rc in CRASH_SIGNALS:
            err = ServerError(f"{err}{CRASH_HINT}")
        return err

    def run(self, ids: list, n: int) -> tuple:
        """`complete(ids, n)`'s output token ids and the seconds the server took for them
        (its own prompt and decode timings); ServerError if its answer lacks them."""
        resp = self.complete(ids, n)
        try:
            t = resp["timings"]
            tokens = [int(x) for x in resp["tokens"]]
            return tokens, (float(t["prompt_ms"]) + float(t["predicted_ms"])) / 1e3
        except (KeyError, TypeError, ValueError) as e:
            got = str(resp)[:200]
            msg = f"{self.binary.name}'s answer lacks tokens or timings ({e!r}): {got}"
            raise ServerError(msg) from None

    def close(self) -> None:
        """Ends the server (SIGTERM, then SIGKILL after `STOP_TIMEOUT_S`); idempotent."""
        try:
            if self.proc.poll() is None:
                self._signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    self._signal(signal.SIGKILL)
                    self.proc.wait()
        finally:
            self._out.close()
            self._remove_log()

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:  # it ended between the poll and the signal
            pass

    def _remove_log(self) -> None:
        if self._own_log:
            self.log.unlink(missing_ok=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
