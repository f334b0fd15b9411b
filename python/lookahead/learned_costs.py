"""What verify forwards cost on this machine, learnt from the forwards the engine runs.

Every verify forward is a measurement: it ran `rows` rows over `context_len` cached tokens in
so many seconds. `LearnedCosts` keeps, per context band (`BAND_EDGES`) and per row count, the
last `WINDOW` measurements as ratios to a prior curve (the start-up measurement of
`lookahead.costs`) and reads a forward's cost as the prior times the *median* of those
ratios: on a 2-core VM a forward can take 2x its usual time for a minute, or 10x once when a
neighbour wakes, and a median over 15 steps moves with neither. A row count not measured in
a band borrows the ratio of the measured row counts around it (interpolated in rows), or of
all bands when its band has none; the prior alone stands where nothing was measured. No
row count is read cheaper than one row.

So a prior with the wrong shape (measured on a busy machine, or on a first run whose thread
pools were cold) is corrected where the engine drafts, within `WINDOW` steps, and what was
learnt is folded back into a `CostModel` (`as_cost_model`) that the next run starts from.

With `switches`, a one-row forward right after a wider one is kept apart: it costs more than
one after a one-row forward (llama.cpp reuses its last compute graph only for a batch of the
same shape: measured on the default model's Q4_1 / Q4_0 files after 700 tokens, 2 threads,
+0.62 / +0.63 ms on 9.6 / 8.7 ms, `research/llamacpp_switch_cost.py`), and that excess is a
cost of the draft before it, which `switch_frac` reports (as a fraction of a one-row
forward) for the sizer to weigh; in the one-row median it would have looked like a dearer
root-only step instead.
"""

from __future__ import annotations

import bisect
import math
from collections import deque

import numpy as np

from lookahead.costs import CURVE_CACHE_FLOATS, CostModel, curve_line

# Context bands (cached tokens) measured apart: attention's share of a forward grows with
# the context, so one band's ratios say little of another's far away.
BAND_EDGES = (0, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
# Measurements kept per (band, rows): the median of this many.
WINDOW = 15
# The prior counts as this many measurements of ratio 1 (log-ratio 0): one or two forwards
# move the estimate part of the way, a full window nearly all of it.
PRIOR_COUNT = 2.0
# The curves read back (`curve`) take in new measurements every this many forwards: a curve
# costs ~5 numpy calls to rebuild, ~45 us right after a forward on llama.cpp's 135M model
# (the CPU's caches full of weights), and one forward moves a median of 15 little.
REFRESH_EVERY = 8
# One-row forwards of a band measured before a switch's excess is read against them.
SWITCH_BASE = 3


def _median(v) -> float:
    """The median of a few numbers (numpy's costs ~10 us a call, this ~1 us: it runs for
    every row count measured, every step)."""
    s = sorted(v)
    n = len(s)
    return float(s[n // 2]) if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2.0


def _shrunk_median(log_ratios) -> float:
    """The median of some measured log-ratios, shrunk towards the prior's 0 as if the prior
    were `PRIOR_COUNT` more measurements."""
    return _median(log_ratios) * len(log_ratios) / (len(log_ratios) + PRIOR_COUNT)


class LearnedCosts:
    """Forward seconds by rows and context, learnt from measured forwards around `prior`."""

    def __init__(self, prior: CostModel, window: int = WINDOW, switches: bool = False):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window!r}")
        self.switches = bool(switches)
        # log(one-row forward after a wider one / the band's learnt one-row forward)
        self._switch: deque = deque(maxlen=int(window))
        self.switch_frac = 0.0  # what a wider forward adds to the next one-row one, shrunk
        self._last_rows: int | None = None  # the last forward's rows (None: not measured)
        self.prior = prior
        self.max_rows = prior.widths[-1]
        self.window = int(window)
        self.count = 0  # forwards measured in all
        self._obs: dict = {}  # (band, rows) -> deque of log(measured / prior)
        self._shrunk: dict = {}  # band -> {rows: shrunk median log-ratio} of `_obs`
        self._ratios: dict = {}  # band -> log-ratio by rows (cached until a new measurement)
        self._curves: dict = {}  # 16-token bucket -> curve (cached until a new measurement)
        self._pending: list = []  # (rows, context_len, seconds) not counted in yet

    @staticmethod
    def band(context_len: int) -> int:
        """The context band of `context_len` cached tokens."""
        return bisect.bisect_right(BAND_EDGES, max(int(context_len), 0)) - 1

    def observe(self, rows: int, context_len: int, seconds: float) -> None:
        """One forward of `rows` rows over `context_len` cached tokens took `seconds`
        (ignored when the prior does not reach `rows`, or `seconds` is not a positive time).
        It is kept as given and counted in with the others every `REFRESH_EVERY` forwards
        (or when something is read): right after a forward each of the ~10 calls of counting
        one in costs several times what it costs among others (~30 us a step, measured)."""
        after, self._last_rows = self._last_rows, int(rows)
        if not 1 <= rows <= self.max_rows or not (0.0 < seconds < math.inf):
            return
        self._pending.append((int(rows), int(context_len), float(seconds), after))
        self.count += 1
        if len(self._pending) >= REFRESH_EVERY:
            self.refresh()

    def gap(self) -> None:
        """The next forward measured does not follow the last one (a prompt ran between)."""
        self._last_rows = None

    def _count_in(self) -> None:
        """Counts the pending forwards in, oldest first."""
        pending, self._pending = self._pending, []
        changed: set = set()
        switched = False
        for rows, context_len, seconds, after in pending:
            modelled = float(self.prior.curve(context_len)[rows])
            key = (self.band(context_len), rows)
            ratio = math.log(seconds / modelled)
            if self.switches and rows == 1 and after is not None and after > 1:
                base = self._obs.get(key)
                one_row = self._shrunk.get(key[0], {}).get(1)
                if base is not None and len(base) >= SWITCH_BASE and one_row is not None:
                    self._switch.append(ratio - one_row)
                    switched = True
                continue
            got = self._obs.get(key)
            if got is None:
                got = self._obs[key] = deque(maxlen=self.window)
            got.append(ratio)
            changed.add(key)
        for band, rows in changed:
            self._shrunk.setdefault(band, {})[rows] = _shrunk_median(self._obs[(band, rows)])
        if switched:
            self.switch_frac = max(math.expm1(_shrunk_median(self._switch)), 0.0)

    def refresh(self) -> None:
        """Counts every forward measured in and drops the cached curves: the next `curve`
        reads them all."""
        self._count_in()
        self._ratios.clear()
        self._curves.clear()

    def measured(self, context_len: int) -> dict:
        """{rows: (median seconds, forwards)} measured in `context_len`'s band."""
        self._count_in()
        b = self.band(context_len)
        curve = self.prior.curve(context_len)
        return {
            r: (float(curve[r] * math.exp(_median(v))), len(v))
            for (band, r), v in sorted(self._obs.items())
            if band == b
        }

    def _log_ratios(self, band: int) -> np.ndarray:
        got = self._ratios.get(band)
        if got is not None:
            return got
        rows = np.arange(self.max_rows + 1)
        mine = self._shrunk.get(band)
        if mine:
            at = sorted(mine)
            got = np.interp(rows, at, [mine[r] for r in at])
        elif self._obs:  # nothing in this band: what all bands say, row count by row count
            pooled: dict = {}
            for (_, r), v in self._obs.items():
                pooled.setdefault(r, []).extend(v)
            at = sorted(pooled)
            got = np.interp(rows, at, [_shrunk_median(pooled[r]) for r in at])
        else:
            got = np.zeros(len(rows))
        self._ratios[band] = got
        return got

    def curve(self, context_len: int) -> np.ndarray:
        """Seconds of a forward of r rows over `context_len` cached tokens at index r (index
        0 unused), up to the prior's widest row: the prior corrected by what was measured, no
        row count cheaper than one row (`lookahead.cost_checks`: wider need not be dearer)."""
        bucket = max(int(context_len), 0) // 16 * 16
        got = self._curves.get(bucket)
        if got is not None:
            return got
        out = self.prior.curve(bucket) * np.exp(self._log_ratios(self.band(bucket)))
        out[2:] = np.maximum(out[2:], out[1])
        out[0] = math.nan
        if len(self._curves) * len(out) < CURVE_CACHE_FLOATS:
            self._curves[bucket] = out
        return out

    def describe(self, context_len: int) -> str:
        """One line as `CostModel.describe`, read off the learnt curve at `context_len`
        cached tokens, with how many measured forwards its band holds (each width keeps its
        last `window`): a band with none shows the prior moved by the other bands' ratios."""
        self.refresh()
        c = self.curve(context_len)
        kept = sum(n for _, n in self.measured(context_len).values())
        ratios = [(w, float(c[w] / c[1])) for w in self.prior.widths[1:]]
        return curve_line(context_len, c[1], ratios, f" ({kept} forwards kept in its band)")

    def as_cost_model(self) -> CostModel:
        """The prior's grid (its widths and contexts, its key) read off the learnt curves:
        what a later run should start from."""
        self.refresh()
        p = self.prior
        secs = tuple(tuple(float(self.curve(c)[w]) for w in p.widths) for c in p.contexts)
        return CostModel(p.widths, p.contexts, secs, dict(p.key))
