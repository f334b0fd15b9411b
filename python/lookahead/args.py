"""Arguments checked and converted on the Python side before they reach the core: ints and
bools (numpy's too, never a bool for an int), arrays from numpy or torch, prediction rows,
request-id lists."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import numpy as np

from lookahead.errors import InvalidInput


def is_int(v) -> bool:
    """A Python or numpy int, not a bool."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def is_bool(v) -> bool:
    """A Python or numpy bool."""
    return isinstance(v, (bool, np.bool_))


def as_numpy(x: Any, what: str) -> np.ndarray:
    """`x` (an array-like or a torch tensor, floats of any width) as a numpy array."""
    try:
        if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor
            x = x.detach().cpu()
            # numpy has no bfloat16 (nor float8): floats go over as float32.
            x = (x.float() if x.is_floating_point() else x).numpy()
        return np.asarray(x)
    except (TypeError, ValueError, RuntimeError) as err:
        raise InvalidInput(f"{what} must be a 2-D array, got {type(x).__name__}") from err


# The most prediction columns (k) a row may have: the cache keeps `recycle_k` <= 64 of them.
MAX_PREDICTION_K = 4096


def predictions(top_ids: Any, top_probs: Any, tokens: Any) -> tuple[np.ndarray, np.ndarray]:
    """`extend`'s prediction rows as (uint32, float32) C-contiguous arrays, their shapes
    (one row per token of `tokens`, 1 to `MAX_PREDICTION_K` columns: checked before any
    value is read, so a broadcast array of a billion rows costs nothing), dtypes and ids
    checked."""
    if top_ids is None or top_probs is None:
        raise InvalidInput("top_ids and top_probs go together: give both or neither")
    ids, probs = as_numpy(top_ids, "top_ids"), as_numpy(top_probs, "top_probs")
    if ids.ndim != 2 or ids.shape != probs.shape or not 1 <= ids.shape[1] <= MAX_PREDICTION_K:
        raise InvalidInput(
            f"top_ids and top_probs must be 2-D of one shape (rows, 1 <= k <= "
            f"{MAX_PREDICTION_K}), got {ids.shape} and {probs.shape}"
        )
    try:
        rows = len(tokens)
    except TypeError:
        rows = None  # not a sequence: the core refuses it
    if rows is not None and ids.shape[0] != rows:
        raise InvalidInput(
            f"top_ids and top_probs need one row per token ({rows}), got {ids.shape[0]}"
        )
    if ids.dtype.kind not in "iu" or probs.dtype.kind != "f":
        raise InvalidInput(
            f"top_ids must hold integers and top_probs floats, got {ids.dtype} and {probs.dtype}"
        )
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= 2**32):
        raise InvalidInput("top_ids must lie in [0, 2**32)")
    # Probabilities outside [0, 1] (NaN too) are refused by the core, before any change.
    return np.ascontiguousarray(ids, dtype=np.uint32), np.ascontiguousarray(probs, np.float32)


def rid_list(rids) -> list:
    """`rids` as a list; a str is iterable too, but drafting for its characters is a mistake."""
    if isinstance(rids, (str, bytes)) or not isinstance(rids, Iterable):
        raise InvalidInput(f"rids must be a sequence of request ids, got {rids!r}")
    return list(rids)


def max_threads() -> int:
    """The most torch threads `--threads` takes: 4 per CPU this process may run on, at most
    256 (more only adds threads that wait; 10,000 of them stall the run for minutes)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return min(256, 4 * max(cpus, 1))
