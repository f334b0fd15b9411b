"""A real SGLang server on CPU, in a subprocess on 127.0.0.1, for the serving tests.

`CpuServer` runs `python -m sglang.launch_server --device cpu` on a free port with the
`sgl_kernel` stand-in (`stand_in/`) first on its `PYTHONPATH`, waits a bounded time for
`/model_info` (failing early, with the log's tail, if the process exits), and always tears
the whole process group down. Logs go to a file kept when a test fails (its path is in every
error message). `save_tiny_model` writes a tiny random fp32 HF model with its tokenizer for
it to load (no download).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

STAND_IN = Path(__file__).resolve().parent / "stand_in"
START_TIMEOUT_S = 240.0
REQUEST_TIMEOUT_S = 300.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def save_tiny_model(path: Path, family: str, seed: int = 0) -> Path:
    """A tiny random fp32 model of `family` with the character tokenizer, saved as HF does,
    with room for 8k positions (a 4k-token prompt plus its answer)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tiny_models import tiny_model, tiny_tokenizer

    model = tiny_model(family, seed=seed, max_position_embeddings=8192)
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def server_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "LOOKAHEAD_CONFIG"}
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(STAND_IN), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
    )
    # Two cores: one torch thread per server keeps several servers from fighting.
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra or {})
    return env


class ServerFailed(RuntimeError):
    """The server exited, or did not answer in time."""


class CpuServer:
    """One `sglang.launch_server --device cpu` process (use as a context manager)."""

    def __init__(
        self,
        model_path: Path,
        args: list[str],
        log_path: Path,
        env: dict[str, str] | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.cmd = [
            sys.executable,
            "-m",
            "sglang.launch_server",
            "--model-path",
            str(model_path),
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--max-total-tokens",
            "20000",
            "--random-seed",
            "0",
            # An idle CPU scheduler otherwise polls its sockets flat out, a core per server:
            # with a module's servers all up on 2 cores, the next one took minutes to start.
            "--sleep-on-idle",
            *args,
        ]
        self.env = server_env(env)
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> CpuServer:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> None:
        self._log = open(self.log_path, "wb")
        try:
            self.proc = subprocess.Popen(
                self.cmd,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,  # one process group: the launcher and its schedulers
            )
            self._wait_ready()
        except BaseException:  # a failed start (or Ctrl-C, a test timeout) leaves nothing
            self.stop()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerFailed(f"server exited with {self.proc.returncode}: {self.tail()}")
            try:
                self.get("/model_info", timeout=2)
                return
            except (OSError, urllib.error.URLError, ValueError):
                time.sleep(0.5)
        raise ServerFailed(f"server not up in {self.start_timeout_s:.0f} s: {self.tail()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=30)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                try:
                    self.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    pass  # unkillable: leave it to the OS rather than hang the tests
        if self.proc is not None:
            try:  # schedulers left behind by a launcher that died first
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if getattr(self, "_log", None) is not None:
            self._log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tail(self, chars: int = 4000) -> str:
        return f"(log {self.log_path})\n{self.log()[-chars:]}"

    def pids(self) -> list[int]:
        """The server's processes (its process group)."""
        out = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if os.getpgid(int(entry.name)) == self.proc.pid:
                        out.append(int(entry.name))
                except (ProcessLookupError, PermissionError):
                    pass
        return out

    def rss_mb(self) -> float:
        """Resident memory of all the server's processes, in MB."""
        total = 0
        for pid in self.pids():
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
            except OSError:
                pass
        return total / 1024

    def cpu_s(self) -> float:
        """CPU time (user + system) all the server's processes have used, in seconds."""
        ticks = 0
        for pid in self.pids():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                ticks += int(fields[11]) + int(fields[12])  # utime, stime
            except (OSError, IndexError, ValueError):
                pass
        return ticks / os.sysconf("SC_CLK_TCK")

    # -- HTTP ------------------------------------------------------------------------------

    def get(self, path: str, timeout: float = REQUEST_TIMEOUT_S) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
            return json.loads(r.read() or b"null")

    def post(self, path: str, body: dict, timeout: float = REQUEST_TIMEOUT_S) -> Any:
        req = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                data = r.read()
        except urllib.error.HTTPError as e:
            raise ServerFailed(f"{path} -> HTTP {e.code}: {e.read()[:500]!r}") from None
        return json.loads(data) if data else None

    def generate(self, text: str | None = None, timeout: float = REQUEST_TIMEOUT_S, **params):
        """`/generate`, greedy unless told otherwise; `params` are sampling params, and
        `input_ids` / `rid` / `extra_key` go in the body."""
        body: dict[str, Any] = {}
        for key in ("input_ids", "rid", "extra_key"):
            if key in params:
                body[key] = params.pop(key)
        if text is not None:
            body["text"] = text
        body["sampling_params"] = {"temperature": 0, **params}
        if self.proc.poll() is not None:
            raise ServerFailed(f"server died: {self.tail()}")
        return self.post("/generate", body, timeout=timeout)

    def metrics(self, timeout: float = 60) -> dict[str, float]:
        """The `lookahead_` samples of `/metrics` (with `--enable-metrics`), summed over
        their labels."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=timeout) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("lookahead_"):
                name, value = line.split("{", 1)[0], float(line.rsplit(" ", 1)[1])
                out[name] = out.get(name, 0.0) + value
        return out

    def stats_lines(self) -> list[dict]:
        """Every `lookahead: cache stats` line the schedulers logged so far."""
        marker = "lookahead: cache stats "
        return [
            json.loads(line.split(marker, 1)[1])
            for line in self.log().splitlines()
            if marker in line
        ]
