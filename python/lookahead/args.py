"""Arguments checked and converted on the Python side before they reach the core: ints and
bools (numpy's too, never a bool for an int), arrays from numpy or torch, prediction rows,
request-id lists; knobs under their old names."""

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


def core_knobs(
    max_depth: Any,
    capacity_nodes: Any,
    own_weight: Any,
    history_weight: Any,
    keep_prompt_as_history: Any,
    background_indexing: Any,
    index_threads: Any,
    history_skip: Any,
    recycle_k: Any,
    recycle_slots: Any,
    recycle_weight: Any,
    corpus_weight: Any,
    capacity_bytes: Any = 0,
) -> tuple:
    """`LookaheadCache`'s knobs checked for type (the core checks their ranges) and
    converted, in the order `_core.Cache` takes them."""
    for name, v in (
        ("max_depth", max_depth),
        ("capacity_nodes", capacity_nodes),
        ("index_threads", index_threads),
        ("recycle_k", recycle_k),
        ("recycle_slots", recycle_slots),
        ("capacity_bytes", capacity_bytes),
    ):
        if not is_int(v) or not 0 <= v < 2**63:
            raise InvalidInput(f"{name} must be a non-negative int below 2**63, got {v!r}")
    for name, flag in (
        ("keep_prompt_as_history", keep_prompt_as_history),
        ("background_indexing", background_indexing),
    ):
        if not is_bool(flag):
            raise InvalidInput(f"{name} must be a bool, got {flag!r}")
    for name, w in (
        ("own_weight", own_weight),
        ("history_weight", history_weight),
        ("recycle_weight", recycle_weight),
        ("corpus_weight", corpus_weight),
    ):
        if isinstance(w, bool) or not isinstance(w, (int, float, np.integer, np.floating)):
            raise InvalidInput(f"{name} must be a number, got {w!r}")
    if history_skip is not None:
        if (
            isinstance(history_skip, (str, bytes))
            or not isinstance(history_skip, Iterable)
            or len(history_skip := tuple(history_skip)) != 2
            or not all(is_int(x) and 0 <= x < 2**63 for x in history_skip)
        ):
            raise InvalidInput(
                f"history_skip must be None or a pair of ints (lo, hi), got {history_skip!r}"
            )
        history_skip = (int(history_skip[0]), int(history_skip[1]))
    return (
        int(max_depth),
        int(capacity_nodes),
        float(own_weight),
        float(history_weight),
        bool(keep_prompt_as_history),
        bool(background_indexing),
        int(index_threads),
        history_skip,
        int(recycle_k),
        int(recycle_slots),
        float(recycle_weight),
        float(corpus_weight),
        int(capacity_bytes),
    )


# Knobs renamed because the old name was untrue: refused, naming the new one, for a release.
RENAMED = {
    "prompt_weight": "own_weight",  # it weighs the request's own outputs too, not only the prompt
    "output_weight": "history_weight",  # it weighs the shared history, kept prompts included
}


def renamed_note(name: str) -> str:
    """What to say of a knob given under its old name (`RENAMED`)."""
    return f"{name} is now {RENAMED[name]} (same meaning and default)"


def refuse_renamed(given: dict, where: str) -> None:
    """Refuse knobs given under an old name (`RENAMED`), or unknown ones, naming the fix."""
    if not given:
        return
    name = next(iter(given))  # the first, as Python itself reports one unexpected argument
    if name in RENAMED:
        raise InvalidInput(f"{where}: {renamed_note(name)}")
    raise TypeError(f"{where}.__init__() got an unexpected keyword argument {name!r}")
