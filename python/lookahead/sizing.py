"""Draft sizing: how many of the drafter's best-first nodes a step verifies.

One object decides it for an engine, with one small interface (`Sizer`): before a step,
`budget(last)` says how many nodes to draft and `cut(...)` how many of the drafted ones to
verify (drafts are best-first with parents before children, so every prefix is a tree, and
the likeliest one of its size); after the step, `observe(step)` learns from what the verify
forward cost and what it accepted. Two policies implement it:

- `CostAwareSizer` (the default): the prefix that maximises this step's expected tokens per
  second, from each node's chance of acceptance (`lookahead.calibration`, learnt from the
  verify results) and what a forward of so many rows costs on this machine (a start-up
  measurement, `lookahead.costs`, corrected by every forward the engine runs,
  `lookahead.learned_costs`, and kept for the next run), plus what a draft adds to the
  one-row forwards after it (`LearnedCosts.switch_frac`: llama.cpp builds a new graph there,
  and on quantized files the next few stay dearer).
  The cut and the learning run in the Rust core (`AcceptanceCalibration.choose`, `.learn`).
- `FixedSizer`: `budget` nodes, `max_budget` after a step that accepted `deep_accept` or more
  (a request that is copying gets the wider tree while it lasts); the shorthand
  `LookaheadGenerator(budget=...)` builds one.

Both drop a draft whose path scores sum below `min_score` for the root alone. The HF engine
(`lookahead.hf.generator`) sizes its steps with one of them. A batched server verifies one
width for the whole batch: `lookahead.batch_sizing.BatchSizer` chooses it by the same
expected-tokens-per-second rule from the same learnt parts (the SGLang plugin on CPU). HF
transformers keeps its draft-length policy in one object the same way
(`candidate_generator.py`'s `update_candidate_strategy`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from lookahead.args import is_int
from lookahead.calibration import AcceptanceCalibration

# The widest draft the cost-aware choice considers (nodes besides the root); the measured
# curve reaches one row further, and its widest row bounds the choice too.
AUTO_MAX_NODES = 32
# The fixed policy's defaults: `FIXED_BUDGET` nodes, and after a step that accepted at least
# `DEEP_ACCEPT` draft tokens up to `max_budget` (default: the budget).
FIXED_BUDGET = 8
DEEP_ACCEPT = 4
# The host's time per step (draft, tree inputs, verify, KV fix-up, learning, stop checks) is
# followed as a moving average with this weight on the newest step: it adds to every choice's
# forward time.
HOST_EMA = 0.1
# What the engine learnt of forward costs is written back at most this often, and only
# after this many new forwards (one small JSON file; see `lookahead.costs.keep`).
KEEP_EVERY_S = 30.0
KEEP_AFTER_FORWARDS = 32
# An argument not given (where None means something).
UNSET = object()


def check_budget(name: str, v) -> int:
    """`v` as a draft budget: an int in [0, MAX_BUDGET] (bools and floats refused): the one
    check of a budget, for the API, the CLI and the benchmarks."""
    from lookahead._core import MAX_BUDGET

    if not is_int(v) or not 0 <= v <= MAX_BUDGET:
        raise ValueError(f"{name} must be an int in [0, {MAX_BUDGET}], got {v!r}")
    return int(v)


def check_min_score(v) -> float:
    """`min_score` as a float (None: 0)."""
    if v is None:
        return 0.0
    if (
        isinstance(v, bool)
        or not isinstance(v, (int, float, np.integer, np.floating))
        or not 0 <= v < math.inf
    ):
        raise ValueError(f"min_draft_score must be a finite number >= 0, got {v!r}")
    return float(v)


@dataclass
class Step:
    """What one verified step tells a sizer."""

    rows: int  # rows of the verify forward (the root and the verified nodes)
    context_len: int  # tokens in the KV cache before the tree
    forward_s: float  # the forward's measured seconds
    host_s: float  # the step's other seconds between forwards, the caller's callback aside
    drafted: tuple | None  # (tokens, parents, scores, matched) before the cut, root first
    path: list  # accepted nodes, root first
    emitted: list  # the step's tokens (accepted drafts + the bonus)
    sampled: bool
    last: int  # what `observe` returned for the step before


class Sizer(Protocol):
    """What an engine asks of a draft-sizing policy."""

    max_nodes: int  # the most nodes a step may verify (the engine's buffers are this wide)
    min_score: float

    def start(self, model) -> None:
        """Before a request's clock starts: measure or load what the policy needs."""

    def budget(self, last: int) -> int:
        """Nodes to draft for a step after one that accepted `last` (what `observe` said)."""

    def cut(self, scores, parents, matched, context_len: int, last: int, sampled: bool) -> int:
        """How many of the drafted nodes (root excluded; `scores` their path scores,
        `parents` their parents, `matched` the n-gram lengths they continue) to verify: 0 for
        the root alone."""

    def observe(self, step: Step) -> int:
        """Learn from a step; returns what it accepted (`last` for the next step; in greedy
        decoding one more where a cut child of its last accepted node would have been)."""

    def finish(self) -> None:
        """After a request: keep what was learnt."""


def passes_min_score(scores, k: int, min_score: float) -> int:
    """`k`, or 0 when the first k nodes' path scores sum below `min_score`."""
    if k > 0 and min_score > 0 and float(np.sum(scores[:k])) < min_score:
        return 0
    return k


class FixedSizer:
    """`budget` nodes per step, `max_budget` after a step that accepted `deep_accept` or
    more, all verified unless their scores sum below `min_score`."""

    def __init__(
        self,
        budget: int = FIXED_BUDGET,
        max_budget: int | None = None,
        min_score: float | None = None,
        deep_accept: int = DEEP_ACCEPT,
    ):
        self.base = check_budget("budget", budget)
        wide = self.base if max_budget is None else check_budget("max_budget", max_budget)
        self.max_nodes = max(self.base, wide)
        self.min_score = check_min_score(min_score)
        self.deep_accept = int(deep_accept)

    def __repr__(self) -> str:
        return f"FixedSizer({self.base}, {self.max_nodes}, {self.min_score:g})"

    def start(self, model) -> None:
        pass

    def budget(self, last: int) -> int:
        return self.max_nodes if last >= self.deep_accept else self.base

    def cut(self, scores, parents, matched, context_len: int, last: int, sampled: bool) -> int:
        return passes_min_score(scores, len(scores), self.min_score)

    def observe(self, step: Step) -> int:
        return len(step.path) - 1

    def finish(self) -> None:
        pass


def choose_nodes(
    expected: np.ndarray, costs: np.ndarray, host_s: float = 0.0, switch_s: float = 0.0
) -> int:
    """How many of the draft's best-first nodes to verify: the k that maximises this step's
    expected tokens per second, (1 + expected[k - 1]) / (costs[k + 1] + host_s + switch_s),
    with k = 0 (the root alone, 1 / (costs[1] + host_s)) among the choices. `expected[k - 1]`
    is the expected accepted length of the first k nodes (non-decreasing in k), `costs[r]`
    the forward time of r rows (index 0 unused), `host_s` the step's time besides the
    forward, `switch_s` what any draft adds besides (to the one-row forwards after it:
    `LearnedCosts.switch_frac`). Ties go to fewer nodes. (The engines' sizer runs the core's
    `AcceptanceCalibration.choose`, the same rule.)"""
    k_max = min(len(expected), len(costs) - 2)
    if k_max <= 0:
        return 0
    gain = 1.0 + np.concatenate(([0.0], np.asarray(expected[:k_max], dtype=np.float64)))
    cost = costs[1 : k_max + 2] + host_s
    cost[1:] += switch_s
    return int(np.argmax(gain / cost))  # first max: fewest nodes


class CostAwareSizer:
    """The prefix of each draft that maximises expected tokens per second (`choose_nodes`)
    by what forwards cost here and what drafted nodes were worth, both learnt as it runs.

    `costs`: "auto" (the curve kept on disk for the model, dtype, device, CPU and threads,
    measured on first use, and corrected by every forward: `keep` writes the correction back
    so the next run starts from it) or a `CostModel` (corrected the same way in memory, never
    written). `max_nodes` caps the nodes a step verifies (and its widest measured row less
    the root does too)."""

    def __init__(self, costs="auto", max_nodes: int = AUTO_MAX_NODES, min_score=None, keep=None):
        from lookahead.costs import CostModel

        if not (costs == "auto" or isinstance(costs, CostModel)):
            raise ValueError(f"costs must be 'auto' or a lookahead.costs.CostModel, got {costs!r}")
        self._source = costs
        self.max_nodes = check_budget("max_nodes", max_nodes)
        self.min_score = check_min_score(min_score)
        self.keeps_file = costs == "auto" if keep is None else bool(keep)
        self.learned = None  # LearnedCosts, once started
        self.calibration = {False: AcceptanceCalibration(), True: AcceptanceCalibration()}
        self.host_s = {False: 0.0, True: 0.0}  # by sampling: sampling does more per step
        self._kept_at = (0, -math.inf)  # (forwards learnt, monotonic time) at the last keep

    def __repr__(self) -> str:
        return f"CostAwareSizer(max_nodes={self.max_nodes}, min_score={self.min_score:g})"

    @property
    def cost_model(self):
        """The start-up curve (None before `start`)."""
        return None if self.learned is None else self.learned.prior

    def start(self, model) -> None:
        if self.learned is not None:
            return
        from lookahead.costs import load_or_measure
        from lookahead.learned_costs import LearnedCosts

        prior = load_or_measure(model) if self._source == "auto" else self._source
        self.learned = LearnedCosts(prior, switches=True)
        self.max_nodes = min(self.max_nodes, max(prior.widths[-1] - 1, 0))

    def budget(self, last: int) -> int:
        return self.max_nodes

    def cut(self, scores, parents, matched, context_len: int, last: int, sampled: bool) -> int:
        # `choose_nodes` over the calibration's `expected`, in one call of the core.
        curve = self.learned.curve(context_len)
        switch_s = self.learned.switch_frac * curve[1]
        k = self.calibration[sampled].choose(
            scores, parents, matched, curve, self.host_s[sampled], switch_s
        )
        return passes_min_score(scores, k, self.min_score)

    def observe(self, step: Step) -> int:
        self.learned.observe(step.rows, step.context_len, step.forward_s)
        h = self.host_s
        h[step.sampled] += HOST_EMA * (step.host_s - h[step.sampled])
        if step.drafted is None:
            return len(step.path) - 1
        verified = step.rows if step.sampled else None
        cal = self.calibration[step.sampled]
        return cal.learn(*step.drafted, step.path, step.emitted, verified)

    def finish(self) -> None:
        """Mark the request's end in the learnt costs (the next request's first forward
        follows its prompt, not a measured forward) and write the learnt curve back to the
        cost file (for "auto" costs), at most every `KEEP_EVERY_S` and after
        `KEEP_AFTER_FORWARDS` new forwards."""
        if self.learned is not None:
            self.learned.gap()  # the next request's prompt runs before its first step
        if not self.keeps_file or self.learned is None or not self.learned.prior.key:
            return
        n, at = self._kept_at
        now = time.monotonic()
        if self.learned.count - n < KEEP_AFTER_FORWARDS or now - at < KEEP_EVERY_S:
            return
        from lookahead.costs import keep

        keep(self.learned.as_cost_model())
        self._kept_at = (self.learned.count, now)


def sizer_from(sizer, budget, max_budget, min_draft_score, cost_model=UNSET) -> Sizer:
    """An engine's sizer from its arguments, the one reading of them for every engine:
    `sizer` as given (checked), else `FixedSizer` when any shorthand (`budget`, `max_budget`,
    `min_draft_score`) is given or `cost_model` is None, else a `CostAwareSizer` of
    `cost_model` ("auto" unless given; a `lookahead.costs.CostModel`) capped at
    `max_budget` (else `budget`, else `AUTO_MAX_NODES`)."""
    shorthands = budget is not None or max_budget is not None or min_draft_score is not None
    if sizer is not None:
        if shorthands or cost_model is not UNSET:
            raise ValueError(
                "give sizer= or the shorthands budget / max_budget / min_draft_score / "
                "cost_model, not both"
            )
        if not all(hasattr(sizer, m) for m in ("budget", "cut", "observe", "start", "finish")):
            raise ValueError(f"sizer must be a lookahead.sizing.Sizer, got {sizer!r}")
        return sizer
    if cost_model is UNSET:
        cost_model = None if shorthands else "auto"
    if cost_model is None:
        return FixedSizer(FIXED_BUDGET if budget is None else budget, max_budget, min_draft_score)
    from lookahead.costs import CostModel

    if not (cost_model == "auto" or isinstance(cost_model, CostModel)):
        raise ValueError(
            f"cost_model must be 'auto', a lookahead.costs.CostModel or None, got {cost_model!r}"
        )
    cap = max_budget if max_budget is not None else budget
    cap = AUTO_MAX_NODES if cap is None else check_budget("max_budget", cap)
    return CostAwareSizer(cost_model, max_nodes=cap, min_score=min_draft_score)
