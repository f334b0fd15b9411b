"""Draft sizing for a batched server: one verify width for every request of a decode step.

A server verifies a batch in one forward of requests x W rows (SGLang's layout: every
request's first W nodes), so its sizing is one W per step, not one cut per request.
`BatchSizer` chooses it by the rule of `lookahead.sizing.CostAwareSizer` (the most expected
tokens per second) from the same learnt parts: the acceptance calibration of
`lookahead.calibration` and forward costs learnt from the server's own forwards
(`lookahead.learned_costs`), around a prior curve until they are measured. The SGLang plugin
on CPU (`lookahead.sglang.worker`) sizes its steps here.
"""

from __future__ import annotations

import math

import numpy as np

from lookahead.args import is_int
from lookahead.calibration import AcceptanceCalibration, learn
from lookahead.sizing import HOST_EMA

__all__ = ["BATCH_MAX_ROWS", "EXPLORE_EVERY", "BatchSizer", "accepted_path", "batch_prior"]


# The widest batch forward the serving sizer prices (requests x width); a wider batch
# verifies floor(BATCH_MAX_ROWS / requests) nodes per request at most.
BATCH_MAX_ROWS = 4096
# Its prior before any forward is measured: a forward of r rows costs r ** PRIOR_EXPONENT
# times one row of PRIOR_ONE_ROW_S. SGLang's CPU engine on 2 cores (SmolLM2-135M, fp32)
# measured about 4x one row at 16 rows and 6x at 128 (BENCHMARKS.md §6.2); the learnt
# ratios replace it wherever forwards were run, the level from the first forward on.
PRIOR_EXPONENT = 0.4
PRIOR_ONE_ROW_S = 0.05
# Every EXPLORE_EVERY-th step verifies the width whose forward was measured least recently
# (never measured first) instead of the chosen one, so that the curve is learnt beyond the
# widths the prior favours: at most 1 step in EXPLORE_EVERY at another width.
EXPLORE_EVERY = 16


def batch_prior(max_rows: int = BATCH_MAX_ROWS):
    """The serving sizer's prior curve (see PRIOR_EXPONENT), to `max_rows` rows."""
    from lookahead.costs import CostModel

    widths = sorted({max_rows, *(1 << i for i in range(max_rows.bit_length()))})
    return CostModel.from_rows({w: PRIOR_ONE_ROW_S * w**PRIOR_EXPONENT for w in widths})


def accepted_path(tokens, parents, n: int, emitted) -> list:
    """The nodes (root first) a verify accepted, from the tokens it emitted: from the root,
    the first of the first `n` nodes that is a child carrying the next emitted token (as
    verification accepts), until none does. `emitted` = the accepted draft tokens and the
    bonus, so the path has at most len(emitted) nodes."""
    path = [0]
    tokens = np.asarray(tokens)[:n].tolist()
    parents = np.asarray(parents)[:n].tolist()
    for tok in list(emitted)[:-1]:
        node = path[-1]
        nxt = next(
            (c for c in range(1, n) if parents[c] == node and tokens[c] == tok),
            None,
        )
        if nxt is None:
            break
        path.append(nxt)
    return path


class BatchSizer:
    """The verify width of a batched decode step: every request of the batch verifies its
    first W nodes (one forward of requests x W rows, the shape SGLang verifies), with W in
    [1, max_width] the width that maximises the batch's expected tokens per second,
    sum(1 + expected accepted of each request's first W - 1 nodes) / (cost of requests x W
    rows at the batch's mean context + the step's host time).

    As `CostAwareSizer`, from what was measured here: the acceptance calibration learns from
    each request's verified nodes (greedy and sampled apart), the forward cost from each
    step's measured forward (`LearnedCosts`, around `batch_prior` until measured), and every
    `explore_every`-th step verifies the least recently measured width instead. One object
    per engine; it keeps nothing per request. Not for several model ranks: their timings differ, so their widths
    would, and every rank must verify the same tree."""

    def __init__(self, max_width: int, costs=None, explore_every: int = EXPLORE_EVERY):
        from lookahead.learned_costs import LearnedCosts

        if not is_int(max_width) or max_width < 1:
            raise ValueError(f"max_width must be an int >= 1, got {max_width!r}")
        if not is_int(explore_every) or explore_every < 0:
            raise ValueError(f"explore_every must be an int >= 0 (0: never), got {explore_every!r}")
        self.max_width = int(max_width)
        self.learned = LearnedCosts(batch_prior() if costs is None else costs)
        self.explore_every = int(explore_every)
        self.calibration = {False: AcceptanceCalibration(), True: AcceptanceCalibration()}
        self.host_s = 0.0
        self.steps = 0
        self.explored = 0
        self._measured_at: dict = {}  # (band, rows) -> step of its last measured forward
        self._step: tuple | None = None  # what `width` chose, until `observe`

    def __repr__(self) -> str:
        return f"BatchSizer(max_width={self.max_width}, explore_every={self.explore_every})"

    def width(
        self, rids, tokens, parents, scores, matched, num_nodes, context_len: int, sampled
    ) -> int:
        """This step's width for requests `rids` whose drafts are `tokens`, `parents`,
        `scores`, `matched` `[bs, >= max_width]` (root first, best-first, `num_nodes[b]` real
        nodes; a `BatchDraft`'s fields), at a mean of `context_len` cached tokens;
        `sampled[b]`: request b samples."""
        bs = len(rids)
        top = max(1, min(self.max_width, self.learned.max_rows // max(bs, 1)))
        gain = np.full(top, float(bs))  # gain[w - 1]: expected tokens at width w
        for b in range(bs):
            n = min(int(num_nodes[b]), top)
            if n > 1:
                e = self.calibration[bool(sampled[b])].expected(
                    scores[b, 1:n], parents[b, 1:n], matched[b, 1:n]
                )
                gain[1:n] += e
                gain[n:] += e[-1]
        curve = self.learned.curve(context_len)
        cost = curve[bs * np.arange(1, top + 1)] + self.host_s
        w = int(np.argmax(gain / cost)) + 1  # first max: the narrowest
        self.steps += 1
        band = self.learned.band(context_len)
        if self.explore_every and self.steps % self.explore_every == 0 and top > 1:
            stale = min(range(1, top + 1), key=lambda v: self._measured_at.get((band, bs * v), -1))
            if stale != w:
                w = stale
                self.explored += 1
        picked = (w, sampled, band, int(context_len))
        self._step = (list(rids), tokens, parents, scores, matched, num_nodes, *picked)
        return w

    def observe(self, forward_s: float, host_s: float, emitted) -> None:
        """After the step `width` sized: its forward took `forward_s`, the rest of the step
        `host_s`, and request b emitted `emitted[b]` (its accepted draft tokens and the
        bonus, in order)."""
        if self._step is None:
            return
        rids, tokens, parents, scores, matched, num_nodes, w, sampled, band, context_len = (
            self._step
        )
        self._step = None
        rows = len(rids) * w
        self.learned.observe(rows, context_len, forward_s)
        self._measured_at[(band, rows)] = self.steps
        if 0.0 <= host_s < math.inf:
            self.host_s += HOST_EMA * (host_s - self.host_s)
        for b in range(len(rids)):
            n = int(num_nodes[b])
            if n <= 1 or b >= len(emitted):
                continue
            drafted = (tokens[b, :n], parents[b, :n], scores[b, :n], matched[b, :n])
            verified = min(n, w)
            path = accepted_path(tokens[b], parents[b], verified, emitted[b])
            s = bool(sampled[b])
            learn(self.calibration[s], drafted, verified, path, emitted[b], s)

    def describe(self, context_len: int) -> dict:
        """What the sizer holds, for a log line: measured forwards by rows at this context's
        band (median ms, count), steps and explored steps."""
        m = self.learned.measured(context_len)
        return {
            "steps": self.steps,
            "explored": self.explored,
            "measured_ms": {r: [round(1e3 * s, 2), k] for r, (s, k) in m.items()},
        }
