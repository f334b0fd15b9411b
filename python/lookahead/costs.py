"""What a verify forward costs on this machine, and how many draft nodes pay for it.

A forward over W new rows costs more than one row by how the device's matrix kernels scale
with rows, and that differs by an order of magnitude between machines: on a CPU with native
bf16 a 8-row forward costs 1.16x one row, on an AVX2-only CPU in fp32 about 1.85x, on a GPU at
batch 1 the same as one row. So the engine measures it (`measure_costs`: the model's real
forward over a KV cache of random tokens, a handful of widths at two context lengths, the
real dtype, device and thread count), refuses a curve no machine has (`implausible`: a wider
forward measured cheaper, or dearer than a forward per row) by measuring again, and keeps
the curve on disk per model, dtype, device, CPU and threads (`load_or_measure`;
`lookahead calibrate` redoes it). The engine then corrects it with its own forwards
(`lookahead.learned_costs`) and writes what it learnt back (`keep`), so the next run starts
from the corrected curve; `lookahead.sizing` decides with it which nodes pay.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lookahead._core import CostGrid
from lookahead.cost_checks import clip_plausible, grid_of, implausible
from lookahead.user_input import quote, read_json_file

# Rows per forward the curve is measured at (root + nodes): dense where CPU curves bend (a
# one-row forward takes a GEMV path, a few rows a GEMM one), sparse where they grow linearly.
WIDTHS = (1, 2, 3, 4, 6, 8, 12, 17, 24, 33)
# Context lengths the curve is measured at; costs at other lengths are linear in the length
# (attention over the cache grows with it), clamped below at the shorter one's.
CONTEXTS = (128, 1024)
# Timed forwards per (width, context), after a warm-up round that runs every shape once
# (thread pools, kernel selection and caches are per shape); their median counts.
REPEATS = 3
# A measured curve no machine has is measured again, this many times in all; the last one
# is then clipped into what is plausible (and says so).
MEASURE_TRIES = 3
# Bump when the measurement or the file changes meaning: older files are re-measured
# (format 1 was the median of 2 rounds, unchecked).
COST_FORMAT = 2
# The longest cost file read (ours are about 1 KB); its grid's bounds: `cost_checks.grid_of`.
MAX_FILE_BYTES = 1 << 20
# Curves kept per model, by context bucket, in floats (8 MiB): the same bound however wide.
CURVE_CACHE_FLOATS = 1 << 20


def cost_dir() -> Path:
    """Where measured curves are kept: `$LOOKAHEAD_COST_DIR`, else `<cache>/costs`."""
    env = os.environ.get("LOOKAHEAD_COST_DIR")
    if env:
        return Path(env).expanduser()
    from lookahead.models import cache_dir

    return cache_dir() / "costs"


def curve_line(context_len: int, one_row_s: float, ratios, where: str = "") -> str:
    """The one line a cost curve is printed as: `context_len` cached tokens (then `where`),
    one row's time and each (width, cost over one row) of `ratios`."""
    got = " ".join(f"W={w} {r:.2f}x" for w, r in ratios)
    return f"{context_len} cached tokens{where}: W=1 {1e3 * one_row_s:.1f} ms  {got}"


@dataclass(frozen=True)
class CostModel:
    """Forward seconds by rows (`widths`) at each of `contexts` cached tokens (`seconds[c][w]`),
    and what it was measured on (`key`; empty for a synthetic curve)."""

    widths: tuple
    contexts: tuple
    seconds: tuple
    key: dict = field(default_factory=dict)
    _curves: dict = field(default_factory=dict, compare=False, repr=False)
    # The core's grid of these numbers (what `curve` and `LearnedCosts` read).
    grid: CostGrid = field(default=None, init=False, compare=False, repr=False)

    def __post_init__(self):
        w, c = list(self.widths), list(self.contexts)
        s = np.asarray(self.seconds, dtype=np.float64)
        if not w or w[0] != 1 or any(b <= a for a, b in zip(w, w[1:])):
            raise ValueError(f"widths must rise from 1, got {self.widths}")
        if not c or any(b <= a for a, b in zip(c, c[1:])) or c[0] < 0:
            raise ValueError(f"contexts must rise from >= 0, got {self.contexts}")
        if s.shape != (len(c), len(w)) or not np.all(np.isfinite(s)) or np.any(s <= 0):
            raise ValueError(
                f"seconds must be {len(c)} x {len(w)} positive numbers, got {self.seconds!r}"
            )
        grid = CostGrid([int(x) for x in w], [int(x) for x in c], s.ravel().tolist())
        object.__setattr__(self, "grid", grid)

    @classmethod
    def from_rows(cls, rows_seconds: dict, key: dict | None = None) -> CostModel:
        """A curve that ignores the context: `{rows: seconds}` (rows 1 needed)."""
        widths = tuple(sorted(int(r) for r in rows_seconds))
        return cls(widths, (0,), (tuple(float(rows_seconds[r]) for r in widths),), key or {})

    def curve(self, context_len: int) -> np.ndarray:
        """Seconds of a forward of r rows over `context_len` cached tokens, at index r
        (index 0 NaN), for r up to the widest measured: linear between widths, and between
        measured contexts (extrapolated past the longest from the last two, never below the
        shortest's), read at the context's 16-token bucket (the core's `CostGrid`, which
        `LearnedCosts` reads its prior from too)."""
        # Curves differ little within 16 tokens; a curve measured at one context is the same
        # at every context (one cached array, however many contexts are asked for).
        bucket = 0 if len(self.contexts) == 1 else max(int(context_len), 0) // 16 * 16
        got = self._curves.get(bucket)
        if got is not None:
            return got
        out = self.grid.curve(bucket)
        if len(self._curves) * len(out) < CURVE_CACHE_FLOATS:
            self._curves[bucket] = out
        return out

    def relative(self, context_len: int) -> list:
        """(rows, cost over one row) at the measured widths, for printing."""
        c = self.curve(context_len)
        return [(w, float(c[w] / c[1])) for w in self.widths]

    def describe(self, context_len: int = 700) -> str:
        """One line: the one-row time and the measured widths' ratios to it."""
        c = self.curve(context_len)
        return curve_line(context_len, c[1], self.relative(context_len)[1:])

    def to_json(self) -> dict:
        """The curve as plain JSON (milliseconds), with its key."""
        return {
            "format": COST_FORMAT,
            "key": self.key,
            "widths": list(self.widths),
            "contexts": list(self.contexts),
            "ms": [[round(1e3 * x, 4) for x in row] for row in self.seconds],
        }

    @classmethod
    def from_json(cls, d: dict) -> CostModel:
        """The inverse of `to_json`; ValueError on a malformed object, or one past the
        bounds of `cost_checks.grid_of`, checked before anything is built from it."""
        if not isinstance(d, dict) or d.get("format") != COST_FORMAT:
            got = quote(d.get("format")) if isinstance(d, dict) else type(d).__name__
            raise ValueError(f"cost file format {got}, expected {COST_FORMAT}")
        widths, contexts, ms, key = grid_of(d)
        return cls(widths, contexts, tuple(tuple(x / 1e3 for x in row) for row in ms), key)


def cpu_name() -> str:
    """The CPU's model name (`/proc/cpuinfo`), else what the platform says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cost_key(model) -> dict:
    """What a measured curve depends on: the model's weights' shape (its config), dtype,
    device, CPU (name, vector features, threads), attention implementation and torch."""
    import torch

    from lookahead.models import cpu_features

    p = next(model.parameters())
    cfg = model.config
    cfg_json = cfg.to_json_string(use_diff=False) if hasattr(cfg, "to_json_string") else repr(cfg)
    device = p.device.type
    if device == "cuda":
        device = f"cuda:{torch.cuda.get_device_name(p.device)}"
    return {
        "model": str(getattr(cfg, "_name_or_path", "") or type(model).__name__),
        "config": hashlib.sha256(cfg_json.encode()).hexdigest()[:16],
        "dtype": str(p.dtype).removeprefix("torch."),
        "device": device,
        "cpu": cpu_name(),
        "cpu_features": cpu_features(),
        "threads": torch.get_num_threads(),
        "attention": str(getattr(cfg, "_attn_implementation", None)),
        "torch": torch.__version__,
    }


def cost_path(key: dict, kind: str = "") -> Path:
    """The file a curve with this key lives in (`kind`: a prefix naming another timing kept
    beside the curves, as `lookahead.llamacpp.flash` keeps its choice)."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    base = Path(key.get("model", "")).name
    name = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in base)
    return cost_dir() / f"{kind}{name[-40:].lstrip('.') or 'model'}-{digest}.json"


def stderr_line(message: str) -> None:
    """A progress line on stderr (where there is one)."""
    if sys.stderr is not None:
        print(message, file=sys.stderr, flush=True)


def _positions_limit(model) -> int | None:
    """Rows a cache of this model may hold: its positions, and a sliding window's rows (a
    windowed cache keeps only those)."""
    cfg = model.config
    limits = [
        v
        for v in (
            getattr(cfg, "max_position_embeddings", None),
            getattr(cfg, "sliding_window", None),
        )
        if isinstance(v, int) and not isinstance(v, bool) and v > 0
    ]
    return min(limits) if limits else None


def measure_costs(
    model,
    *,
    widths: Sequence[int] = WIDTHS,
    contexts: Sequence[int] = CONTEXTS,
    repeats: int = REPEATS,
    seed: int = 0,
) -> CostModel:
    """Time `model`'s forward of each width of new rows over each context length of cached
    random tokens, as the engine calls it (explicit positions, a 4-D mask, its KV cache);
    the median of `repeats` rounds after a warm-up one, rounds interleaved across widths so
    drift hits all alike. Widths and contexts are capped so that every row has a position
    (and fits a sliding window); a model of fewer than 2 positions gets a one-row curve."""
    import torch

    from lookahead.hf.kv import last_logits_only, new_cache

    widths = tuple(int(w) for w in widths)
    limit = _positions_limit(model)
    if limit is not None:
        widths = tuple(w for w in widths if w <= limit // 2) or (1,)
        cap = limit - widths[-1]
        if cap < 1:  # no room for one cached token and one row
            return CostModel((1,), (0,), ((1.0,),), cost_key(model))
        ctxs = sorted({max(1, min(int(c), cap)) for c in contexts})
    else:
        ctxs = sorted({max(1, int(c)) for c in contexts})
    p = next(model.parameters())
    dev, dtype = p.device, p.dtype
    vocab = model.get_input_embeddings().weight.shape[0]
    eager = getattr(model.config, "_attn_implementation", None) == "eager"
    fill_kw = last_logits_only(model)  # the fill needs no logits
    gen = torch.Generator().manual_seed(seed)
    cuda = dev.type == "cuda"
    out = []
    on_device = torch.cuda.device(dev) if cuda else contextlib.nullcontext()
    with torch.inference_mode(), on_device:  # CUDA events record on the model's device
        kv = new_cache(model)
        have = 0
        for ctx in ctxs:
            if ctx > have:
                fill = torch.randint(0, vocab, (1, ctx - have), generator=gen).to(dev)
                pos = torch.arange(have, ctx, device=dev)[None]
                model(
                    input_ids=fill, position_ids=pos, past_key_values=kv, use_cache=True, **fill_kw
                )
            have = ctx
            times = {w: [] for w in widths}
            for rnd in range(repeats + 1):
                for w in widths:
                    ids = torch.randint(0, vocab, (1, w), generator=gen).to(dev)
                    pos = torch.arange(ctx, ctx + w, device=dev)[None]
                    mask = torch.ones((1, 1, w, ctx + w), dtype=torch.bool, device=dev)
                    mask[0, 0, :, ctx:] = torch.ones((w, w), dtype=torch.bool, device=dev).tril()
                    if eager:
                        mask = torch.zeros(mask.shape, dtype=dtype, device=dev).masked_fill_(
                            ~mask, torch.finfo(dtype).min
                        )
                    if cuda:
                        start = torch.cuda.Event(enable_timing=True)
                        end = torch.cuda.Event(enable_timing=True)
                        start.record()
                    t0 = time.perf_counter()
                    model(
                        input_ids=ids,
                        position_ids=pos,
                        attention_mask=mask,
                        past_key_values=kv,
                        use_cache=True,
                    )
                    if cuda:
                        end.record()
                        end.synchronize()
                        secs = start.elapsed_time(end) / 1e3
                    else:
                        secs = time.perf_counter() - t0
                    kv.crop(-w)
                    if rnd:
                        times[w].append(secs)
            out.append(tuple(float(np.median(times[w])) for w in widths))
    return CostModel(widths, tuple(ctxs), tuple(out), cost_key(model))


def _read(path: Path, key: dict, progress) -> CostModel | None:
    """The curve kept in `path` for `key`, or None (missing, another key, damaged or
    implausible: said in one line)."""
    try:
        got = CostModel.from_json(read_json_file(path, MAX_FILE_BYTES, "cost file"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:  # corrupt, truncated, hostile, another format: measure
        if progress:
            progress(f"lookahead: re-measuring the verify cost ({path} unusable: {e})")
        return None
    if got.key != key:
        return None
    why = implausible(got)
    if why is not None:
        if progress:
            progress(f"lookahead: re-measuring the verify cost ({path} is implausible: {why})")
        return None
    return got


def keep_json(obj: dict, path: Path) -> str:
    """Write `obj` as JSON to `path` atomically (`lookahead.output.replace_file`, mode 0644 so
    that others sharing the folder can read it); says where, or why not (an unwritable folder
    costs the file, never the run)."""
    from lookahead.output import replace_file

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_file(path, json.dumps(obj, indent=1))
        return f"kept in {path}"
    except OSError as e:
        return f"not kept: {e}"


def keep(costs: CostModel, path: Path | None = None) -> str:
    """Write `costs` to `path` (default: its key's file) atomically (`keep_json`)."""
    return keep_json(costs.to_json(), cost_path(costs.key) if path is None else path)


def timing_of(model) -> tuple[dict, Callable]:
    """(key, measure) of `model`'s curve: its own (`cost_source()`, the llama.cpp engine's
    `LlamaCppModel`), else an HF model's (`cost_key`, `measure_costs`)."""
    own = getattr(model, "cost_source", None)
    if callable(own):
        return own()
    return cost_key(model), measure_costs


def load_or_measure(
    model, *, refresh: bool = False, progress: Callable[[str], None] | None = stderr_line
) -> CostModel:
    """The curve kept on disk for this model, dtype, device, CPU and thread count (for a
    llama.cpp model: its GGUF file, threads, CPU, llama.cpp build and flash attention;
    `timing_of`), else one measured now (a few seconds, with a progress line) and kept for
    later runs. A file that cannot be read or written, or holds an implausible curve, costs
    a measurement, never the run; a measurement that is implausible is repeated
    (`MEASURE_TRIES` in all), and the last one clipped plausible."""
    key, measure = timing_of(model)
    path = cost_path(key)
    if not refresh:
        got = _read(path, key, progress)
        if got is not None:
            return got
    if progress:
        what = ", ".join(str(key[k]) for k in ("dtype", "device") if k in key) or key.get("model")
        progress(
            f"lookahead: measuring what a verify forward costs on this machine "
            f"({what}, {key.get('threads')} threads; once per model)..."
        )
    t0 = time.perf_counter()
    for attempt in range(1, MEASURE_TRIES + 1):
        got = CostModel.from_json(measure(model).to_json())  # as a later run reads it
        why = implausible(got)
        if why is None:
            break
        if progress:
            again = "measuring again" if attempt < MEASURE_TRIES else "clipping it plausible"
            progress(f"lookahead: implausible verify cost ({why}; a busy machine?): {again}")
    if why is not None:
        got = clip_plausible(got)
    where = keep(got, path)
    if progress:
        progress(
            f"lookahead: measured in {time.perf_counter() - t0:.1f} s ({where}); "
            f"{got.describe(700)}"
        )
    return got
