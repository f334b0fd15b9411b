"""Draft sizing: the learnt forward costs, the plausibility check of measured curves, the
healing of cost files, and the two sizers behind one interface."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lookahead import batch_sizing, costs, learned_costs, sizing
from lookahead.cost_checks import clip_plausible, implausible
from lookahead.costs import CostModel, load_or_measure
from lookahead.hf import LookaheadGenerator
from lookahead.learned_costs import SETTLE, WINDOW, LearnedCosts
from lookahead.sizing import CostAwareSizer, FixedSizer, Step
from reference_costs import ReferenceLearnedCosts
from tiny_models import hf_generate, repetitive_prompt, tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VOCAB = 128
LINEAR = {1: 0.1, 2: 0.2, 4: 0.4, 8: 0.8, 17: 1.7, 33: 3.3}


# -- learnt costs -----------------------------------------------------------------------
def test_learnt_costs_converge_on_scripted_forward_times():
    # The prior says every row is free past the first; the machine says 2 rows cost 1.5x
    # and 8 rows 3x. Within a window of forwards the curve says what the machine does.
    prior = CostModel.from_rows({1: 0.1, 33: 0.1})
    learned = LearnedCosts(prior)
    truth = {1: 0.1, 2: 0.15, 8: 0.3}
    for _ in range(3 * WINDOW):
        for rows, sec in truth.items():
            learned.observe(rows, 500, sec)
    c = learned.curve(500)
    for rows, sec in truth.items():
        assert c[rows] == pytest.approx(sec, rel=0.15)
    # Between measured rows the ratio is interpolated; no row count is cheaper than one.
    assert truth[2] * 0.85 <= c[5] <= truth[8] * 1.15
    assert np.all(c[2:] >= c[1])
    # Another band that saw nothing borrows what all bands saw.
    assert learned.curve(5000)[8] == pytest.approx(0.3, rel=0.15)


def test_learnt_curves_take_in_every_forward():
    prior = CostModel.from_rows(LINEAR)
    learned = LearnedCosts(prior)
    before = learned.curve(300)[4]
    learned.observe(4, 300, 0.2)
    first = learned.curve(300)[4]
    assert first < before  # read back at once, moved part of the way (the prior counts)
    learned.observe(4, 300, 0.01)
    assert learned.curve(300)[4] < first


FORWARD = st.tuples(
    st.integers(-1, 40),  # rows (the prior reaches 33)
    st.integers(-5, 3000),  # cached tokens: several bands, 16-token buckets
    st.one_of(st.floats(0.01, 2.0), st.sampled_from([0.0, -1.0, math.inf, math.nan])),
    st.booleans(),  # a gap (a prompt) before it
)


@settings(max_examples=60, deadline=None)
@given(st.lists(FORWARD, max_size=120), st.booleans(), st.integers(1, 16), st.integers(1, 4))
def test_the_cores_learnt_costs_follow_the_python_rule(forwards, switches, window, settle):
    prior = CostModel((1, 2, 4, 8, 33), (128, 1024), ((1, 1.5, 2, 3, 9), (2, 2.6, 3.1, 4, 12)))
    core = LearnedCosts(prior, window=window, switches=switches, settle=settle)
    ref = ReferenceLearnedCosts(prior, window=window, switches=switches, settle=settle)
    for rows, ctx, sec, gap in forwards:
        for learned in (core, ref):
            if gap:
                learned.gap()
            learned.observe(rows, ctx, sec)
        assert core.count == ref.count
        assert core.switch_frac == pytest.approx(ref.switch_frac, rel=1e-12, abs=1e-15)
        for at in (ctx, 0, 700, 2999):
            got, want = core.curve(at), ref.curve(at)
            assert math.isnan(got[0])
            np.testing.assert_allclose(got[1:], want[1:], rtol=1e-12)
        got, want = core.measured(ctx), ref.measured(ctx)
        assert got.keys() == want.keys()
        for r, (sec, n) in want.items():
            assert got[r][0] == pytest.approx(sec, rel=1e-12) and got[r][1] == n


def test_bad_learnt_cost_policies_are_refused():
    from lookahead._core import CostGrid
    from lookahead._core import LearnedCosts as Core
    from lookahead.errors import InvalidInput

    prior = CostModel.from_rows(LINEAR)
    for window in (0, -3):
        with pytest.raises(InvalidInput, match="window"):
            LearnedCosts(prior, window=window)
    grid = CostGrid([1, 2], [0], [0.1, 0.2])
    for bad in (
        ([2, 4], [0], [0.1, 0.2]),  # widths must start at one row
        ([1, 2], [0], [0.1, -0.2]),
        ([1, 2], [0], [0.1]),
        ([1, 2], [9, 9], [0.1, 0.2, 0.1, 0.2]),
    ):
        with pytest.raises(InvalidInput):
            CostGrid(*bad)
    for bands, prior_count in (([256, 512], 2.0), ([0, 0], 2.0), ([0], -1.0), ([0], math.nan)):
        with pytest.raises(InvalidInput):
            Core(grid, bands, 15, prior_count, 3, 8, False)
    with pytest.raises(InvalidInput, match="settle"):
        Core(grid, [0], 15, 2.0, 3, 0, True)
    with pytest.raises(TypeError):  # the prior is a checked CostGrid, not its numbers
        Core([1, 2], [0], 15, 2.0, 3, 8, False)


def test_learnt_costs_ignore_outliers():
    prior = CostModel.from_rows(LINEAR)
    learned = LearnedCosts(prior)
    rng = random.Random(1)
    for i in range(10 * WINDOW):
        # A stall of 10x one forward in 5, and +-10 % jitter on the rest.
        stall = 10.0 if i % 5 == 0 else rng.uniform(0.9, 1.1)
        learned.observe(4, 300, 0.2 * stall)  # the machine: 4 rows cost 0.2 s, not 0.4
    assert learned.curve(300)[4] == pytest.approx(0.2, rel=0.15)
    # Nonsense times and rows the prior does not reach are ignored.
    n = learned.count
    for bad in (0.0, -1.0, math.inf, math.nan):
        learned.observe(4, 300, bad)
    learned.observe(0, 300, 0.1)
    learned.observe(99, 300, 0.1)
    assert learned.count == n


def test_learnt_costs_fold_into_the_next_runs_prior():
    prior = CostModel((1, 2, 4), (128, 1024), ((1.0, 1.2, 1.4), (2.0, 2.2, 2.4)), {"k": 1})
    learned = LearnedCosts(prior)
    for _ in range(WINDOW):
        learned.observe(2, 900, 1.1)  # 2 rows at 900 tokens: half the prior's ~2.1 s
    folded = learned.as_cost_model()
    assert folded.key == prior.key and folded.widths == prior.widths
    assert folded.contexts == prior.contexts
    assert folded.curve(900)[2] < 0.7 * prior.curve(900)[2]
    assert implausible(folded) is None
    # the one-line summary reads the band it is asked about, and says what that band holds
    two = learned.curve(900)[2] / learned.curve(900)[1]
    assert learned.describe(900).startswith(
        f"900 cached tokens ({WINDOW} forwards kept in its band)"
    )
    assert f"W=2 {two:.2f}x" in learned.describe(900)
    assert learned.describe(100).startswith("100 cached tokens (0 forwards kept in its band)")


def test_learnt_costs_keep_what_a_draft_adds_to_the_forwards_after_it_apart():
    # A one-row forward costs 0.1 s once settled, 0.15 s right after a 4-row one and 0.12 s
    # next (llama.cpp rebuilds its graph; the quantized kernels' caches refill): the excess is
    # the draft's, not dearer one-row steps.
    # Kept apart for 3 one-row forwards here (`settle`; the shipped `SETTLE` is 1).
    prior, settle = CostModel.from_rows(LINEAR), 3
    apart, mixed = LearnedCosts(prior, switches=True, settle=settle), LearnedCosts(prior)
    after = (0.15, 0.12, 0.1)
    for _ in range(3 * WINDOW):
        for rows, sec in ((1, 0.1),) * (settle + 3) + ((4, 0.3),) + tuple((1, x) for x in after):
            apart.observe(rows, 300, sec)
            mixed.observe(rows, 300, sec)
    assert apart.curve(300)[1] == pytest.approx(0.1, rel=1e-9)
    # the median of their summed excess, shrunk towards none as if the prior were 2 more
    assert apart.switch_frac == pytest.approx(0.7 * WINDOW / (WINDOW + 2))
    assert apart.switches_kept == WINDOW
    # Without `switches` (the serving sizer's batches) nothing is kept apart.
    assert mixed.switch_frac == 0.0 and mixed.switches_kept == 0
    # The one-row forwards after a gap (a prompt ran between) count nowhere, and a gap or a
    # wider forward ends a draft's tail early.
    fresh = LearnedCosts(prior, switches=True, settle=settle)
    for rows, sec in ((1, 0.1),) * (settle + learned_costs.SWITCH_BASE) + ((4, 0.3), (1, 0.15)):
        fresh.observe(rows, 300, sec)
    fresh.gap()
    assert fresh.switches_kept == 1 and fresh.switch_frac == pytest.approx(0.5 / 3)
    for _ in range(settle):
        fresh.observe(1, 300, 5.0)
    assert fresh.switches_kept == 1 and fresh.curve(300)[1] == pytest.approx(0.1)
    fresh.observe(4, 300, 0.3)
    fresh.observe(1, 300, 0.2)
    fresh.observe(4, 300, 0.3)
    assert fresh.switches_kept == 2 and fresh.switch_frac == pytest.approx(0.75 / 2)
    # Switched off (research.llamacpp_switch_cost does), a one-row forward after a wider one
    # counts as any one-row forward.
    assert fresh.switches and fresh.window == WINDOW
    fresh.switches = False
    fresh.observe(4, 300, 0.3)
    for _ in range(3):
        fresh.observe(1, 300, 0.15)
    assert fresh.switches_kept == 2 and not fresh.switches
    assert fresh.curve(300)[1] > 0.11


def test_cost_aware_sizer_weighs_what_a_draft_adds_to_the_forwards_after_it():
    # Rows cost 1 s + 0.1 s a row. A one-node draft accepted 65 % of the time pays for its
    # row (1.65 tokens for 1.1 s)... until each draft is seen to make the next forward 1 s
    # dearer: then the root alone.
    s = CostAwareSizer(CostModel.from_rows({1: 1.0, 33: 4.2}))
    s.start(None)
    one, draft = (np.array([0.6]), np.array([0]), np.zeros(1)), 1
    s.calibration[False].prior_weight = 1e9  # chances: the scores as given
    assert s.cut(*one, 100, 0, False) == draft
    for _ in range(3 * WINDOW):
        for _ in range(SETTLE + 3):
            s.observe(_step(1, [0], None, forward_s=1.0))
        s.observe(_step(2, [0], None, forward_s=1.1))
        s.observe(_step(1, [0], None, forward_s=2.0))
    assert s.learned.switch_frac > 0.5
    assert s.cut(*one, 100, 0, False) == 0
    # The request's end is a gap: the next request's first forwards follow its prompt.
    t = CostAwareSizer(CostModel.from_rows({1: 1.0, 33: 4.2}))
    t.start(None)
    for _ in range(SETTLE + learned_costs.SWITCH_BASE):
        t.learned.observe(1, 100, 1.0)
    t.learned.observe(2, 100, 1.1)
    t.finish()
    t.learned.observe(1, 100, 2.0)  # the prompt's tail: nobody's
    t.learned.observe(2, 100, 1.1)
    assert t.learned.switches_kept == 0
    for _ in range(SETTLE):
        t.learned.observe(1, 100, 2.0)
    assert t.learned.switches_kept == 1


# -- plausibility -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "rows, why",
    [
        # The first run of a fresh clone on an AVX2-only CPU: 4-17 rows cheaper than one.
        ({1: 0.3156, 2: 1.638, 3: 0.593, 4: 0.246, 8: 0.262, 33: 1.588}, "W=2 costs 5.2x"),
        ({1: 0.3156, 3: 0.593, 4: 0.246, 8: 0.262, 33: 1.588}, "W=4 costs 0.78x W=1"),
        # A busy machine: 2 rows 16x one.
        ({1: 1.010, 2: 16.297, 4: 17.0}, "more than"),
    ],
)
def test_implausible_curves_are_named(rows, why):
    got = implausible(CostModel.from_rows(rows))
    assert got is not None and why in got
    assert implausible(clip_plausible(CostModel.from_rows(rows))) is None


def test_plausible_curves_pass():
    assert implausible(CostModel.from_rows(LINEAR)) is None
    assert implausible(CostModel.from_rows({1: 0.1, 2: 0.172, 4: 0.223, 33: 0.335})) is None
    # A wider forward cheaper than a narrower one is real (kernels block by rows): measured
    # on an AVX512 EPYC in fp32, 4 rows 0.75x 3 rows.
    epyc = {1: 43.2, 2: 62.4, 3: 81.9, 4: 61.7, 6: 60.3, 8: 60.4, 12: 68.0, 33: 106.6}
    assert implausible(CostModel.from_rows(epyc)) is None
    # A longer context measured much cheaper than a shorter one is refused too.
    two = CostModel((1, 2), (128, 1024), ((1.0, 1.5), (0.5, 0.7)))
    assert "its cost at 128" in implausible(two)


def test_an_implausible_file_is_measured_again(monkeypatch, tmp_path):
    monkeypatch.setenv("LOOKAHEAD_COST_DIR", str(tmp_path))
    model = tiny_model("llama")
    key = costs.cost_key(model)
    bad = CostModel.from_rows({1: 0.3156, 4: 0.246, 33: 1.588}, key)
    path = costs.cost_path(key)
    path.write_text(json.dumps(bad.to_json()))
    good = CostModel.from_rows(LINEAR, key)
    monkeypatch.setattr(costs, "measure_costs", lambda m: good)
    lines = []
    assert load_or_measure(model, progress=lines.append) == good
    assert "implausible" in lines[0] and "W=4 costs 0.78x W=1" in lines[0]
    assert CostModel.from_json(json.loads(path.read_text())) == good


def test_an_implausible_measurement_is_repeated_then_fitted(monkeypatch, tmp_path):
    monkeypatch.setenv("LOOKAHEAD_COST_DIR", str(tmp_path))
    model = tiny_model("llama")
    key = costs.cost_key(model)
    bad = CostModel.from_rows({1: 1.0, 2: 16.0, 4: 17.0}, key)
    good = CostModel.from_rows(LINEAR, key)
    runs = iter([bad, good])
    monkeypatch.setattr(costs, "measure_costs", lambda m: next(runs))
    lines = []
    assert load_or_measure(model, refresh=True, progress=lines.append) == good
    assert sum("measuring again" in line for line in lines) == 1
    # Implausible every time: the last one is clipped plausible, and kept.
    monkeypatch.setattr(costs, "measure_costs", lambda m: bad)
    lines.clear()
    got = load_or_measure(model, refresh=True, progress=lines.append)
    assert sum("implausible verify cost" in line for line in lines) == costs.MEASURE_TRIES, lines
    assert "clipping it plausible" in lines[-2]
    assert implausible(got) is None


def test_a_bad_cost_file_does_not_survive_one_generate(monkeypatch, tmp_path):
    # A file that passes the check but is 1000x off (measured on another machine state):
    # one generate later the file holds what this machine's forwards measured.
    monkeypatch.setenv("LOOKAHEAD_COST_DIR", str(tmp_path))
    model = tiny_model("llama")
    key = costs.cost_key(model)
    slow = CostModel.from_rows({1: 1.0, 2: 1.0, 4: 1.0, 33: 1.0}, key)
    path = costs.cost_path(key)
    path.write_text(json.dumps(slow.to_json()))
    monkeypatch.setattr(sizing, "KEEP_AFTER_FORWARDS", 8)
    gen = LookaheadGenerator(model)
    ids = repetitive_prompt(random.Random(2), VOCAB)
    res = gen.generate(ids, max_new_tokens=40, eos_token_id=None)
    assert res.ids == hf_generate(model, ids, 40)
    healed = CostModel.from_json(json.loads(path.read_text()))
    assert healed.key == key and healed.curve(len(ids))[1] < 0.1


# -- the sizers -------------------------------------------------------------------------
def _step(rows, path, drafted=None, last=0, sampled=False, forward_s=0.01):
    return Step(rows, 100, forward_s, 0.001, drafted, path, [0] * len(path), sampled, last)


def test_fixed_sizer():
    s = FixedSizer(4, 12, 0.5)
    assert s.max_nodes == 12 and s.budget(0) == 4 and s.budget(sizing.DEEP_ACCEPT) == 12
    assert s.cut(np.array([0.3, 0.3, 0.1]), np.array([0, 1, 0]), np.zeros(3), 10, 0, False) == 3
    assert (
        s.cut(np.array([0.3, 0.1]), np.array([0, 1]), np.zeros(2), 10, 0, False) == 0
    )  # below 0.5
    assert s.observe(_step(3, [0, 1, 2])) == 2
    with pytest.raises(ValueError, match="budget"):
        FixedSizer(-1)
    with pytest.raises(ValueError, match="min_draft_score"):
        FixedSizer(4, min_score=math.nan)


def test_cost_aware_sizer_cuts_by_the_learnt_curve():
    # Prior: rows are free. Then the machine shows every row costing a forward: the next
    # cut verifies the root alone, though the prior would take every node.
    s = CostAwareSizer(CostModel.from_rows({1: 1.0, 33: 1.0}))
    s.start(None)
    scores = np.full(8, 0.5)
    parents = np.arange(8)  # a chain
    assert s.cut(scores, parents, np.zeros(8), 100, 0, False) == 8
    for _ in range(WINDOW):
        for r in (1,) * (SETTLE + 1) + (2, 5, 9):  # one-row forwards settle after SETTLE
            s.observe(_step(r, [0], None, forward_s=float(r)))
    assert s.cut(scores, parents, np.zeros(8), 100, 0, False) == 0
    with pytest.raises(ValueError, match="costs"):
        CostAwareSizer("fast")


def test_every_sizer_gives_plain_greedy_output():
    model = tiny_model("llama")
    rng = random.Random(12)
    prompts = [repetitive_prompt(rng, VOCAB) for _ in range(3)]
    refs = [hf_generate(model, ids, 40) for ids in prompts]
    for sizer in (
        FixedSizer(8, 16, 0.85),
        FixedSizer(8, 16, 0.3),
        FixedSizer(16, 16, 0.3),
        CostAwareSizer(CostModel.from_rows({1: 1.0, 4: 1.2, 33: 8.0})),
    ):
        gen = LookaheadGenerator(model, sizer=sizer)
        for ids, ref in zip(prompts, refs):
            assert gen.generate(ids, max_new_tokens=40, eos_token_id=None).ids == ref, sizer


# -- the serving sizer (one width per batch) --------------------------------------------
N = 8


def chain_batch(bs: int, score: float = 0.9):
    """`bs` chain drafts of N nodes, root first: tokens 10.., each node's path score
    `score ** depth`."""
    depth = np.arange(N)
    tokens = np.tile(10 + depth, (bs, 1)).astype(np.int32)
    parents = np.tile(depth - 1, (bs, 1)).astype(np.int32)
    scores = np.tile(score**depth, (bs, 1)).astype(np.float32)
    matched = np.zeros((bs, N), dtype=np.uint8)
    return tokens, parents, scores, matched, np.full(bs, N, dtype=np.int32)


def serve(sizer, forward_s, accepts, bs=4, steps=160, noise=None):
    """Runs `steps` batched steps: each request accepts `accepts` of its chain (capped by
    the step's width) and a forward of r rows takes `forward_s(r)` seconds (times
    `noise(step)`). Returns the widths chosen, step by step, and whether each explored."""
    tokens, parents, scores, matched, nodes = chain_batch(bs)
    rids = [f"r{i}" for i in range(bs)]
    widths, explored = [], []
    for step in range(steps):
        before = sizer.explored
        w = sizer.width(rids, tokens, parents, scores, matched, nodes, 300, [False] * bs)
        widths.append(w)
        explored.append(sizer.explored > before)
        acc = min(accepts, w - 1)
        emitted = [tokens[b, 1 : 1 + acc].tolist() + [99] for b in range(bs)]
        t = forward_s(bs * w) * (noise(step) if noise else 1.0)
        sizer.observe(t, 0.001, emitted)
    return widths, explored


def settled(widths, explored, last=60):
    chosen = [w for w, e in zip(widths[-last:], explored[-last:]) if not e]
    return max(set(chosen), key=chosen.count)


def test_accepted_path_follows_the_emitted_tokens_through_a_tree():
    # root 0 -> 1 (a) -> 3 (c); root -> 2 (b) -> 4 (d); 5: another child of 1 carrying d
    tokens = [7, 21, 22, 23, 24, 24]
    parents = [-1, 0, 0, 1, 2, 1]
    assert batch_sizing.accepted_path(tokens, parents, 6, [22, 24, 5]) == [0, 2, 4]
    assert batch_sizing.accepted_path(tokens, parents, 6, [21, 24, 5]) == [0, 1, 5]
    assert batch_sizing.accepted_path(tokens, parents, 4, [22, 24, 5]) == [0, 2]  # 4 not verified
    assert batch_sizing.accepted_path(tokens, parents, 6, [30]) == [0]  # the bonus alone


def test_serving_sizer_widens_where_rows_are_cheap_and_drafts_land():
    sizer = batch_sizing.BatchSizer(N)
    widths, explored = serve(sizer, lambda r: 0.05 + 0.0005 * r, accepts=6)
    assert settled(widths, explored) == N


def test_serving_sizer_verifies_the_root_alone_where_rows_are_dear_and_drafts_miss():
    sizer = batch_sizing.BatchSizer(N)
    widths, explored = serve(sizer, lambda r: 0.02 * r, accepts=0)
    assert settled(widths, explored) == 1
    # It explores, but at most one step in EXPLORE_EVERY.
    assert 0 < sum(explored) <= len(widths) // batch_sizing.EXPLORE_EVERY


def test_serving_sizer_finds_the_width_the_machine_pays_for():
    # Rows are free up to 8 per forward, then dear: with 4 requests that is width 2, although
    # every draft would be accepted whole and the prior prices 8 rows at 1.7x one row.
    sizer = batch_sizing.BatchSizer(N)
    widths, explored = serve(sizer, lambda r: 0.05 if r <= 8 else 0.05 * r / 4, accepts=7)
    assert settled(widths, explored) == 2


def test_serving_sizer_ignores_a_noisy_neighbour():
    # One forward in 10 takes 10x: the choice of width does not move.
    sizer = batch_sizing.BatchSizer(N)
    widths, explored = serve(
        sizer,
        lambda r: 0.02 * r,
        accepts=0,
        noise=lambda step: 10.0 if step % 10 == 3 else 1.0,
    )
    assert settled(widths, explored) == 1


def test_serving_sizer_caps_the_rows():
    sizer = batch_sizing.BatchSizer(N, explore_every=0)
    bs = batch_sizing.BATCH_MAX_ROWS // 2 + 1  # two rows each would pass the widest priced forward
    tokens, parents, scores, matched, nodes = chain_batch(bs, score=1.0)
    rids = list(range(bs))
    assert sizer.width(rids, tokens, parents, scores, matched, nodes, 100, [True] * bs) == 1
    sizer.observe(0.1, 0.0, [[5]] * bs)
    with pytest.raises(ValueError, match="max_width"):
        batch_sizing.BatchSizer(0)
    with pytest.raises(ValueError, match="explore_every"):
        batch_sizing.BatchSizer(4, explore_every=-1)
