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

The policy is here (the bands, the window, the prior's weight, what counts as a switch); the
bookkeeping runs in the Rust core (`lookahead._core.LearnedCosts`, which `LearnedCosts`
extends): each forward is counted in at once, and a curve is rebuilt from the counts when
read. The same work in numpy cost the llama.cpp engine 25-27 us a step on the 135M model
right after a forward (research/README.md, `llamacpp_host_split`), and only that little
because it counted forwards in every 8.

With `switches`, the first `SETTLE` one-row forwards after a wider one are kept apart: they
cost more than settled ones, and that excess is a cost of the draft before it, which
`switch_frac` reports (summed over them, as a fraction of a settled one-row forward) for
the sizer to weigh; in the one-row median it would have looked like a dearer root-only
step instead. llama.cpp reuses its last compute graph only for a batch of the same shape
(measured on the default model's Q4_1 / Q4_0 files after 700 tokens, 2 threads: the first
one-row forward after a wider one +0.62 / +0.63 ms on 9.6 / 8.7 ms,
`research/llamacpp_switch_cost.py`). On the quantized files the forwards after that stay
dearer for several more (`research/llamacpp_after_wide.py`: after one 4-row forward over
300 tokens on a 2-vCPU Xeon, +0.59 / +0.72 of a row over the next 8 on Q4_1 / Q4_0, +0.07
on F16), but keeping all 8 apart lost in the loop (research/README.md). The first `SETTLE`
after a prompt are kept apart too, and are nobody's excess.
"""

from __future__ import annotations

from lookahead._core import LearnedCosts as _LearnedCosts
from lookahead.costs import CostModel, curve_line

# Context bands (cached tokens) measured apart: attention's share of a forward grows with
# the context, so one band's ratios say little of another's far away.
BAND_EDGES = (0, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
# Measurements kept per (band, rows): the median of this many.
WINDOW = 15
# The prior counts as this many measurements of ratio 1 (log-ratio 0): one or two forwards
# move the estimate part of the way, a full window nearly all of it.
PRIOR_COUNT = 2.0
# One-row forwards of a band measured before a switch's excess is read against them.
SWITCH_BASE = 3
# One-row forwards after a wider forward (or a prompt) before one-row forwards count as
# settled again; the excess of those before is the wider forward's. The quantized files'
# excess fades only over 6-8 one-row forwards, but 8 lost to 1 in the loop from a cold start
# (Q4_0 on the Xeon: 0.947 against 0.985 of plain decoding, every one of 4 rounds; Q4_1 a
# tie): with 8 the engine verified more 4-row drafts, and they accepted less
# (research/README.md, `llamacpp_cold_start --compare settle`).
SETTLE = 1


class LearnedCosts(_LearnedCosts):
    """Forward seconds by rows and context, learnt from measured forwards around `prior`.

    From the core (`lookahead._core.LearnedCosts`):
    - `observe(rows, context_len, seconds)`: one forward of `rows` rows over `context_len`
      cached tokens took `seconds` (ignored when the prior does not reach `rows`, or
      `seconds` is not a positive time); with `switches`, a one-row forward among the first
      `settle` (default `SETTLE`) after a wider one counts towards `switch_frac` instead
      (once its band has `SWITCH_BASE` settled one-row forwards to read it against), and one
      after a prompt counts nowhere;
    - `gap()`: the next forward measured follows a prompt, not the last one measured;
    - `curve(context_len)`: seconds of a forward of r rows over `context_len` cached tokens
      at index r (index 0 NaN), up to the prior's widest row: the prior corrected by what
      was measured in the context's band (or all bands, where it has none), read at the
      context's 16-token bucket, no row count cheaper than one row (`lookahead.cost_checks`:
      wider need not be dearer);
    - `band(context_len)`, `max_rows`, `window`, `switches`, `count` (forwards measured in
      all), `switch_frac`, `switches_kept`."""

    def __new__(
        cls,
        prior: CostModel,
        window: int = WINDOW,
        switches: bool = False,
        settle: int | None = None,
    ):
        learned = super().__new__(
            cls,
            prior.grid,
            list(BAND_EDGES),
            int(window),
            PRIOR_COUNT,
            SWITCH_BASE,
            SETTLE if settle is None else int(settle),
            bool(switches),
        )
        learned.prior = prior  # the CostModel (its key, widths and contexts: `as_cost_model`)
        return learned

    def measured(self, context_len: int) -> dict:
        """{rows: (median seconds, forwards)} measured in `context_len`'s band."""
        return {r: (sec, n) for r, sec, n in super().measured(context_len)}

    def describe(self, context_len: int) -> str:
        """One line as `CostModel.describe`, read off the learnt curve at `context_len`
        cached tokens, with how many measured forwards its band holds (each width keeps its
        last `window`): a band with none shows the prior moved by the other bands' ratios."""
        c = self.curve(context_len)
        kept = sum(n for _, n in self.measured(context_len).values())
        ratios = [(w, float(c[w] / c[1])) for w in self.prior.widths[1:]]
        return curve_line(context_len, c[1], ratios, f" ({kept} forwards kept in its band)")

    def as_cost_model(self) -> CostModel:
        """The prior's grid (its widths and contexts, its key) read off the learnt curves:
        what a later run should start from."""
        p = self.prior
        secs = tuple(tuple(float(self.curve(c)[w]) for w in p.widths) for c in p.contexts)
        return CostModel(p.widths, p.contexts, secs, dict(p.key))
