"""Result files: the header every one starts with (command, date, machine, versions), written
whole or not at all, and checked writable before any slow work starts."""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import importlib.metadata
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path

PEER_DISTRIBUTIONS = (
    "lookahead-spec",
    "sglang",
    "apache-tvm-ffi",
    "arctic-inference",
    "transformers",
    "torch",
    "numpy",
    "numba",
)


def machine() -> str:
    """One line: CPU model, cores, OS, Python."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (
        f"{cpu}, {os.cpu_count()} cpus, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}"
    )


def versions(names=PEER_DISTRIBUTIONS) -> dict[str, str]:
    """Installed version of each distribution, or "not installed"."""
    out = {}
    for n in names:
        try:
            out[n] = importlib.metadata.version(n)
        except importlib.metadata.PackageNotFoundError:
            out[n] = "not installed"
    return out


def now() -> str:
    """UTC timestamp, seconds."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def git_commit(where: Path | None = None) -> str:
    """`git describe --always --dirty` of the lookahead checkout holding `where`, or
    "unknown". By default `where` is this package's folder, then the current directory:
    an installed wheel has no checkout, but a benchmark run from a clone does."""
    places = [where] if where is not None else [Path(__file__).resolve().parent, Path.cwd()]
    for place in places:
        top = _git(["rev-parse", "--show-toplevel"], place)
        # Only our own checkout: a package installed inside some other repository must not
        # record that repository's commit as ours.
        if top and (Path(top) / "python" / "lookahead" / "output.py").is_file():
            return _git(["describe", "--always", "--dirty"], Path(top)) or "unknown"
    return "unknown"


def _git(args: list[str], cwd: Path) -> str:
    import subprocess

    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10, cwd=cwd)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def header(command: str) -> dict:
    """The context every result file starts with."""
    return {
        "command": command,
        "date": now(),
        "git": git_commit(),
        "machine": machine(),
        "versions": versions(),
        # Timings are only comparable on a quiet machine: the load when the run started.
        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def write_json(path: str | os.PathLike, payload: dict) -> None:
    """Write `payload` as indented JSON (NaN as null)."""

    def clean(x):
        if isinstance(x, float) and x != x:
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_output(path, json.dumps(clean(payload), indent=1) + "\n")


def _is_special(real: Path) -> bool:
    """An existing non-regular file (/dev/stdout, /dev/null, a FIFO): written in place."""
    return real.exists() and not real.is_file() and not real.is_dir()


def write_output(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` as `check_outputs` proved it can be: a file through a temporary
    one in its folder renamed over it (a failed write keeps the old file whole), a device or
    FIFO in place (a rename would replace it)."""
    real = Path(os.path.realpath(path))  # a symlink's target is replaced, not the link
    if _is_special(real):
        with os.fdopen(_open_special(real), "w") as f:
            f.write(text)
        return
    replace_file(real, text, real.stat().st_mode & 0o777 if real.exists() else 0o644)


def replace_file(path: Path, text: str, mode: int = 0o644) -> None:
    """`text` written to a temporary file in `path`'s folder, given `mode` (mkstemp makes it
    private; ours are ordinary files), and renamed over `path`: a reader sees the old file or
    the new one, whole; a failed write leaves no temporary file."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# How long a FIFO is waited on for a reader before the write fails (it would hang).
FIFO_READER_WAIT_S = 10.0


def _open_special(real: Path) -> int:
    """A device or FIFO opened for writing; a FIFO waits at most `FIFO_READER_WAIT_S` for a
    reader (opening it blocking would wait forever), then OSError."""
    deadline = time.monotonic() + FIFO_READER_WAIT_S
    while True:
        try:
            fd = os.open(real, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:
            if e.errno != errno.ENXIO:  # ENXIO: a FIFO no one has opened for reading yet
                raise
            if time.monotonic() > deadline:
                why = f"no reader opened the FIFO within {FIFO_READER_WAIT_S:g} s"
                raise OSError(e.errno, why, str(real)) from None
            time.sleep(0.05)
            continue
        os.set_blocking(fd, True)
        return fd


def _unwritable(path: str | os.PathLike) -> str | None:
    """Why `path` could not be written at the end, or None, found by doing it now short of
    writing bytes: permission bits (root passes them all) do not say whether /proc, /sys or a
    read-only mount takes a file. A file needs its folder to take a new one (a probe is made
    and removed: `write_output` renames one there) and, if it exists, to open for writing (as
    the benches' direct writes do); a device or FIFO must open for writing."""
    real = Path(os.path.realpath(path))
    if real.is_dir():
        return "it is a folder"
    if _is_special(real):
        try:
            os.close(os.open(real, os.O_WRONLY | getattr(os, "O_NONBLOCK", 0)))
        except OSError as e:
            if e.errno != errno.ENXIO:  # a FIFO with no reader yet: the write waits for one
                return e.strerror or str(e)
        return None
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{real.name}.", suffix=".probe", dir=real.parent)
    except OSError as e:
        return f"{real.parent} takes no new file ({e.strerror or e})"
    os.close(fd)
    os.unlink(probe)
    if real.exists():
        try:
            os.close(os.open(real, os.O_WRONLY))
        except OSError as e:
            return e.strerror or str(e)
    return None


def command_line(prog: str, argv) -> str:
    """The command as a user would type it."""
    return shlex.join([*prog.split(), *(sys.argv[1:] if argv is None else list(argv))])


# What matplotlib writes (its savefig picks the format from the extension).
PLOT_FORMATS = (
    ".png",
    ".svg",
    ".svgz",
    ".pdf",
    ".eps",
    ".ps",
    ".jpg",
    ".jpeg",
    ".webp",
    ".tif",
    ".tiff",
)


def check_outputs(*paths, plot=None) -> None:
    """Fails now, before any slow work, if an output file could not be written later: its
    folder is created if missing and must take a new file, an existing file must open for
    writing (see `_unwritable`); `plot` must name an image format."""
    if plot is not None and not str(plot).lower().endswith(PLOT_FORMATS):
        raise SystemExit(f"cannot draw {plot}: name a {', '.join(PLOT_FORMATS)} file")
    for path in (*paths, plot):
        if path is None:
            continue
        folder = Path(path).parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise SystemExit(f"cannot write {path}: {e.strerror or e}") from None
        problem = _unwritable(path)
        if problem:
            raise SystemExit(f"cannot write {path}: {problem}")
