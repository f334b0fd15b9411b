"""Whether a measured verify-cost curve is one a machine can have, and the nearest one that
is: a curve measured on a busy or cold machine (seen: W=4 0.78x W=1 on a first run, W=2 16x
W=1 beside a build) is refused and measured again (`lookahead.costs.load_or_measure`).

A curve need not rise with every row: CPU matrix kernels pick their blocking by the row
count, and on an AVX512 EPYC in fp32 a 4-row forward measured 0.75x a 3-row one, again and
again. What no machine does is run several rows in less time than one (the one-row forward
does a part of the same work), run W rows slower than W one-row forwards by a margin, or
run a longer context faster than a shorter one.

`grid_of` checks a cost file's grid before anything is built from it: a file from outside may
hold anything (Infinity, 10**12 rows, a thousand widths)."""

from __future__ import annotations

import math

import numpy as np

from lookahead.args import is_int
from lookahead.user_input import quote

# A forward of W rows may be measured this much cheaper than one row (or a longer context
# than a shorter one) before the curve is refused: timing noise.
CHEAPER_SLACK = 0.85
# A forward of W rows may cost at most this many times W one-row forwards.
DEARER_PER_ROW = 1.5
# What a cost file's grid may hold: widths and contexts per curve, the widest row, the
# longest context, the dearest forward (ms). Ours hold 10 widths up to 33 rows at 2
# contexts; past these a file is measured again.
MAX_GRID = 64
MAX_ROWS = 1 << 13
MAX_CONTEXT = 1 << 24
MAX_MS = 1e9


def grid_of(d: dict) -> tuple:
    """(widths, contexts, ms rows, key) of a cost file's JSON object, each within the bounds
    above (ints, finite positive times), or ValueError naming what is wrong."""
    widths = _ints(d.get("widths"), "widths", 1, MAX_ROWS)
    contexts = _ints(d.get("contexts"), "contexts", 0, MAX_CONTEXT)
    ms = d.get("ms")
    if not isinstance(ms, list) or len(ms) != len(contexts):
        raise ValueError(f"malformed cost file: ms must be {len(contexts)} rows")
    for row in ms:
        if not isinstance(row, list) or len(row) != len(widths):
            raise ValueError(f"malformed cost file: each ms row must hold {len(widths)} times")
        if not all(_real(x) and 0 < x < MAX_MS for x in row):
            raise ValueError(
                f"malformed cost file: times must be in (0, {MAX_MS:g}) ms: {quote(row)}"
            )
    if not isinstance(d.get("key"), dict):
        raise ValueError("malformed cost file: no key object")
    return widths, contexts, [[float(x) for x in row] for row in ms], dict(d["key"])


def _real(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _ints(v, name: str, lo: int, hi: int) -> tuple:
    if not isinstance(v, list) or not 1 <= len(v) <= MAX_GRID:
        raise ValueError(f"malformed cost file: {name} must be a list of 1 to {MAX_GRID} ints")
    if not all(is_int(x) and lo <= x <= hi for x in v):
        raise ValueError(f"malformed cost file: {name} must be ints in [{lo}, {hi}]: {quote(v)}")
    return tuple(v)


def implausible(costs) -> str | None:
    """Why no machine has this curve (a `CostModel`), or None: at some context a forward of
    several rows measured cheaper than one row (by more than `CHEAPER_SLACK` allows) or
    dearer than `DEARER_PER_ROW` * W one-row forwards, or a longer context cheaper than a
    shorter one at the same rows."""
    s = np.asarray(costs.seconds, dtype=np.float64)
    for ci, row in enumerate(s):
        at = f"at {costs.contexts[ci]} cached tokens"
        for w, x in zip(costs.widths, row):
            if x < CHEAPER_SLACK * row[0]:
                return f"{at} W={w} costs {x / row[0]:.2f}x W=1"
            if x > DEARER_PER_ROW * w * row[0]:
                return f"{at} W={w} costs {x / row[0]:.1f}x W=1, more than {DEARER_PER_ROW}x a row"
    for ci in range(1, len(s)):
        ratio = s[ci] / s[ci - 1]
        if ratio.min() < CHEAPER_SLACK:
            w = costs.widths[int(np.argmin(ratio))]
            return (
                f"W={w} at {costs.contexts[ci]} cached tokens costs {ratio.min():.2f}x "
                f"its cost at {costs.contexts[ci - 1]}"
            )
    return None


def clip_plausible(costs):
    """`costs` clipped into what `implausible` accepts: each width between one row and
    `DEARER_PER_ROW` * W rows' worth, each context at least the shorter one's."""
    s = np.maximum.accumulate(np.asarray(costs.seconds, dtype=np.float64), axis=0)
    w = np.asarray(costs.widths, dtype=np.float64)
    one = s[:, :1]
    s = np.clip(s, one, DEARER_PER_ROW * w[None, :] * one)
    secs = tuple(tuple(float(x) for x in row) for row in s)
    return type(costs)(costs.widths, costs.contexts, secs, dict(costs.key))
