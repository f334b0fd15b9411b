"""The learnt forward costs as they were written in Python (`lookahead.learned_costs` until
the core took the bookkeeping over), each forward counted in at once, and a measured curve
read at a context as `lookahead.costs.CostModel.curve` read it in numpy (until the core's
`CostGrid` took it over): the rules the core must follow, for tests to compare against."""

from __future__ import annotations

import bisect
import math
from collections import deque

import numpy as np
from lookahead.learned_costs import BAND_EDGES, PRIOR_COUNT, SETTLE, SWITCH_BASE, WINDOW


def reference_curve(model, context_len: int) -> np.ndarray:
    """`model.curve(context_len)` in numpy (`model` a `lookahead.costs.CostModel`)."""
    bucket = 0 if len(model.contexts) == 1 else max(int(context_len), 0) // 16 * 16
    s = np.asarray(model.seconds, dtype=np.float64)
    c = model.contexts
    if len(c) == 1 or bucket <= c[0]:
        at = s[0]
    else:  # linear between measured contexts, extrapolated past the longest from the last two
        i = min(int(np.searchsorted(c, bucket)), len(c) - 1)
        t = (bucket - c[i - 1]) / (c[i] - c[i - 1])
        at = np.maximum(s[i - 1] + t * (s[i] - s[i - 1]), s[0])
    out = np.interp(np.arange(model.widths[-1] + 1), model.widths, at)
    out[0] = math.nan
    return out


def median(v) -> float:
    s = sorted(v)
    n = len(s)
    return float(s[n // 2]) if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2.0


def shrunk_median(log_ratios) -> float:
    return median(log_ratios) * len(log_ratios) / (len(log_ratios) + PRIOR_COUNT)


class ReferenceLearnedCosts:
    def __init__(self, prior, window: int = WINDOW, switches: bool = False, settle: int = SETTLE):
        self.prior, self.window, self.switches, self.settle = prior, window, switches, settle
        self.max_rows = prior.widths[-1]
        self.count = 0
        self.switch: deque = deque(maxlen=window)
        self.switch_frac = 0.0
        # the unsettled one-row forwards: [charged, left, excess, measured], or None
        self.tail = [False, self.settle, 0.0, False]
        self.obs: dict = {}  # (band, rows) -> deque of log(measured / prior)

    @staticmethod
    def band(context_len: int) -> int:
        return bisect.bisect_right(BAND_EDGES, max(int(context_len), 0)) - 1

    def observe(self, rows: int, context_len: int, seconds: float) -> None:
        valid = 1 <= rows <= self.max_rows and 0.0 < seconds < math.inf
        if valid:
            self.count += 1
        if self.switches and rows > 1:
            self._close()
            self.tail = [True, self.settle, 0.0, False]
        elif self.switches and rows == 1 and self.tail is not None:
            base = self.obs.get((self.band(context_len), 1))
            if valid and base is not None and len(base) >= SWITCH_BASE:
                settled = float(reference_curve(self.prior, context_len)[1]) * math.exp(
                    shrunk_median(base)
                )
                self.tail[2] += seconds / settled - 1.0
                self.tail[3] = True
            self.tail[1] -= 1
            if self.tail[1] == 0:
                self._close()
            return
        if not valid:
            return
        ratio = math.log(seconds / float(reference_curve(self.prior, context_len)[rows]))
        key = (self.band(context_len), rows)
        self.obs.setdefault(key, deque(maxlen=self.window)).append(ratio)

    def _close(self) -> None:
        t, self.tail = self.tail, None
        if t is not None and t[0] and t[3]:
            self.switch.append(t[2])
            self.switch_frac = max(shrunk_median(self.switch), 0.0)

    def gap(self) -> None:
        self._close()
        self.tail = [False, self.settle, 0.0, False]

    def curve(self, context_len: int) -> np.ndarray:
        bucket = max(int(context_len), 0) // 16 * 16
        band = self.band(bucket)
        rows = np.arange(self.max_rows + 1)
        mine = {r: shrunk_median(v) for (b, r), v in self.obs.items() if b == band}
        if not mine:  # nothing in this band: what all bands say, row count by row count
            pooled: dict = {}
            for (_, r), v in self.obs.items():
                pooled.setdefault(r, []).extend(v)
            mine = {r: shrunk_median(v) for r, v in pooled.items()}
        if mine:
            at = sorted(mine)
            ratios = np.interp(rows, at, [mine[r] for r in at])
        else:
            ratios = np.zeros(len(rows))
        out = reference_curve(self.prior, bucket) * np.exp(ratios)
        out[2:] = np.maximum(out[2:], out[1])
        out[0] = math.nan
        return out

    def measured(self, context_len: int) -> dict:
        b = self.band(context_len)
        curve = reference_curve(self.prior, context_len)
        return {
            r: (float(curve[r] * math.exp(median(v))), len(v))
            for (band, r), v in sorted(self.obs.items())
            if band == b
        }
