"""Cost-aware drafting: the choice on synthetic curves, the online calibration, the measured
curve and its file, and the engine's output under every choice."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from lookahead import costs
from lookahead.calibration import AcceptanceCalibration
from lookahead.costs import CostModel, load_or_measure, measure_costs
from lookahead.hf import LookaheadGenerator
from lookahead.learned_costs import LearnedCosts
from lookahead.sizing import choose_nodes
from tiny_models import hf_generate, repetitive_prompt, tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def curve(f, rows=33):
    """costs[r] = f(r) for r in 1..rows (index 0 unused, as `CostModel.curve` gives)."""
    return np.array([np.nan] + [float(f(r)) for r in range(1, rows + 1)])


# -- the choice -------------------------------------------------------------------------
def test_flat_curve_takes_the_widest_tree():
    p = np.linspace(0.6, 0.01, 32)
    assert choose_nodes(np.cumsum(p), curve(lambda r: 1.0)) == 32


def test_steep_curve_drafts_only_when_confident():
    steep = curve(lambda r: 1 + 0.9 * (r - 1))  # every row costs almost a forward
    assert choose_nodes(np.cumsum(np.full(8, 0.3)), steep) == 0
    assert choose_nodes(np.cumsum(np.full(8, 0.99)), steep) == 8
    # An AVX2-like step (one extra row ~1.85x, more rows nearly free): pays from E > 0.85.
    step = curve(lambda r: 1.0 if r == 1 else 1.85 + 0.01 * r)
    assert choose_nodes(np.cumsum(np.array([0.5, 0.2, 0.1])), step) == 0
    assert choose_nodes(np.cumsum(np.array([0.7, 0.6, 0.5, 0.4])), step) == 4


def test_curve_with_a_knee_stops_at_the_knee():
    knee = curve(lambda r: 1.0 if r <= 8 else 1 + 0.5 * (r - 8))
    assert choose_nodes(np.cumsum(np.full(32, 0.5)), knee) == 7  # 8 rows: the root and 7 nodes


def test_non_monotone_curve_skips_a_costly_width():
    # A measured fp32 CPU curve: 3 rows cost more than 4 (a GEMM path kicks in at 4).
    bumpy = curve(lambda r: {1: 1.0, 2: 1.7, 3: 2.15}.get(r, 1.6 + 0.05 * r), rows=8)
    k = choose_nodes(np.cumsum(np.array([0.9, 0.8, 0.7, 0.02, 0.02, 0.01, 0.01])), bumpy)
    assert k == 3  # 4 rows beats 2 and 3 rows


def test_host_time_makes_rows_relatively_cheaper():
    c = curve(lambda r: 1 + 0.2 * (r - 1))
    e = np.cumsum([0.15, 0.1])
    assert choose_nodes(e, c) == 0
    assert choose_nodes(e, c, host_s=5.0) == 2


def test_choice_edges():
    c = curve(lambda r: 1.0, rows=4)
    assert choose_nodes(np.cumsum(np.zeros(5)), c) == 0  # ties go to fewer nodes
    assert choose_nodes(np.cumsum(np.ones(10)), c) == 3  # no further than the curve's widest row
    assert choose_nodes(np.cumsum(np.array([])), c) == 0


# -- the calibration --------------------------------------------------------------------
def test_calibration_starts_from_the_prior_and_is_monotone():
    cal = AcceptanceCalibration()
    s = np.array([0.01, 0.3, 0.55, 0.97])
    for m in (0, 1, 3, 12):
        assert np.allclose(cal.predict(s, np.full(4, m)), [0.025, 0.35, 0.55, 0.975])
    rng = np.random.default_rng(0)
    for _ in range(500):  # reversed evidence: low scores accepted, high ones not
        sc = rng.uniform(0, 1, 16)
        cal.observe(sc, rng.integers(0, 12, 16), rng.uniform(0, 1, 16) < 1 - sc)
    assert np.all(np.diff(cal.table(), axis=1) >= 0)


@pytest.mark.parametrize("truth", [lambda s: s**2, lambda s: np.minimum(1.0, 0.2 + s)])
def test_calibration_converges_on_a_scripted_drafter(truth):
    rng = np.random.default_rng(1)
    cal = AcceptanceCalibration()
    for _ in range(3000):
        sc = rng.uniform(0, 1, 16) ** 2  # scores crowd low, as the drafter's do
        cal.observe(sc, np.zeros(16), rng.uniform(0, 1, 16) < truth(sc))
    mids = cal.prior
    want = truth(mids)
    # Bands are ranges: compare with the truth at their middles, loosely at the wide ones.
    assert np.max(np.abs(cal.table()[0] - want)) < 0.08


def test_expected_length_respects_the_tree():
    cal = AcceptanceCalibration()
    # Three siblings of score 0.55 under the root: one path is accepted, so together they
    # cannot be worth more than 1; a child (conditional score 0.97) is accepted with its
    # parent's chance times its own.
    scores = np.array([0.55, 0.55, 0.55, 0.55 * 0.97])
    e = cal.expected(scores, np.array([0, 0, 0, 1]), np.zeros(4))
    assert np.allclose(e, [0.55, 1.0, 1.0, 1.0 + 0.55 * 0.975])
    # Match groups: what follows a long match is learnt apart from what follows a short one.
    for _ in range(300):
        cal.observe(np.full(4, 0.25), np.full(4, 8), np.ones(4))
    assert cal.predict(np.array([0.25]), np.array([8]))[0] > 0.9
    assert cal.predict(np.array([0.25]), np.array([1]))[0] == pytest.approx(0.25)


def test_a_parent_scored_zero_gives_its_children_no_chance():
    # The core floors its scores above 0; a hand-built `Draft` may not (CI: a scripted drafter
    # scoring every node 0 divided by zero here).
    from lookahead.calibration import conditional

    scores, parents = np.array([0.0, 0.0, 0.5]), np.array([0, 1, 0])
    assert conditional(scores, parents).tolist() == [0.0, 0.0, 0.5]
    e = AcceptanceCalibration().expected(scores, parents, np.zeros(3))
    assert np.isfinite(e).all() and e[-1] == pytest.approx(e[1] + 0.55)


def reference_expected(table, scores, parents, matched) -> np.ndarray:
    """`AcceptanceCalibration.expected` as it was written in Python (until the core took it
    over): the reference the core's `AcceptanceCalibration.expected` must equal bit for bit."""
    import bisect

    from lookahead.calibration import BAND_EDGES, MATCH_EDGES

    edges, groups = BAND_EDGES.tolist(), MATCH_EDGES.tolist()
    rows = table.tolist()
    sc, par, mt = list(map(float, scores)), list(map(int, parents)), list(map(int, matched))
    left = [1.0] * (len(sc) + 1)
    chance = [1.0] * (len(sc) + 1)
    out, total = [], 0.0
    for i, p in enumerate(par):
        above = sc[p - 1] if p else 1.0
        cond = sc[i] / above if above > 0 else 0.0
        band = max(bisect.bisect_right(edges, cond) - 1, 0)
        c = rows[bisect.bisect_right(groups, mt[i])][band] * chance[p]
        c = max(min(c, left[p]), 0.0)
        left[p] -= c
        chance[i + 1] = left[i + 1] = c
        total += c
        out.append(total)
    return np.array(out)


@st.composite
def drafts(draw):
    """A best-first-like draft without its root (parents before children, path scores that
    shrink down a branch, scores on band edges now and then) and a learnt table."""
    n = draw(st.integers(0, 40))
    parents, scores = [], []
    for i in range(n):
        p = draw(st.integers(0, i))
        edge = draw(st.sampled_from([None, 0.05, 0.3, 0.5, 0.95, 1.0]))
        cond = edge if edge is not None else draw(st.floats(0.0, 1.0))
        parents.append(p)
        scores.append((scores[p - 1] if p else 1.0) * cond)
    matched = draw(st.lists(st.integers(0, 20), min_size=n, max_size=n))
    seed = draw(st.integers(0, 2**31))
    return (np.array(scores, dtype=np.float32), np.array(parents, dtype=np.int32),
            np.array(matched, dtype=np.uint8), seed)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(drafts(), st.floats(0.0, 0.05), st.sampled_from([0.0, 0.0, 0.1, 0.7]))
def test_the_cores_cut_is_the_python_rule(draft, host_s, switch_s):
    scores, parents, matched, seed = draft
    rng = np.random.default_rng(seed)
    cal = AcceptanceCalibration()
    for _ in range(int(rng.integers(0, 12))):  # a table learnt from something, not only the prior
        k = int(rng.integers(1, 30))
        cal.observe(rng.uniform(0, 1, k), rng.integers(0, 12, k), rng.uniform(0, 1, k) < 0.6)
    e = cal.expected(scores, parents, matched)
    ref = reference_expected(cal.table(), scores, parents, matched)
    assert e.tolist() == ref.tolist()
    # A curve with a knee and bumps: the choice must be the numpy rule's, ties included.
    costs = curve(lambda r: 1.0 + 0.3 * (r - 1) + (0.5 if r % 4 == 0 else 0.0))
    if seed % 3 == 0:
        costs = curve(lambda r: 1.0 + 0.9 * (r > 1) + 0.45 * max(r - 2, 0))  # Q4_1-like
    # The core's cut, from the draft's own dtypes (float32 scores, int32 parents, uint8 matched).
    got = cal.choose(scores, parents, matched, costs, host_s, switch_s)
    assert got == choose_nodes(ref, costs, host_s, switch_s)


def test_the_cores_cut_refuses_bad_drafts():
    from lookahead._core import Calibration
    from lookahead.calibration import BAND_EDGES, MATCH_EDGES, PRIOR_WEIGHT
    from lookahead.errors import InvalidInput

    cal = AcceptanceCalibration()
    c = curve(lambda r: float(r))
    ok = (np.array([0.5, 0.2]), np.array([0, 1], dtype=np.int32), np.zeros(2, dtype=np.uint8))
    assert cal.choose(*ok, c, 0.0, 0.0) == 0
    bad = [
        (np.array([0.5, 0.2]), np.array([0, 2], dtype=np.int32)),  # a parent after its child
        (np.array([0.5, 0.2]), np.array([-1, 0], dtype=np.int32)),
        (np.array([0.5, np.nan]), np.array([0, 1], dtype=np.int32)),
        (np.array([0.5]), np.array([0, 1], dtype=np.int32)),  # lengths differ
    ]
    for scores, parents in bad:
        with pytest.raises(InvalidInput):
            cal.expected(scores, parents, np.zeros(2, np.uint8))
        with pytest.raises(InvalidInput):
            cal.choose(scores, parents, np.zeros(2, np.uint8), c, 0.0, 0.0)
    with pytest.raises(InvalidInput, match="ascending"):
        Calibration(BAND_EDGES[::-1].copy(), MATCH_EDGES, 8.0, 0.998)
    with pytest.raises(InvalidInput, match="ascending"):
        Calibration(BAND_EDGES, MATCH_EDGES[::-1].copy(), 8.0, 0.998)
    for w, d in ((0.0, 0.998), (np.inf, 0.998), (8.0, 0.0), (8.0, 1.5), (np.nan, 0.998)):
        with pytest.raises(InvalidInput):
            AcceptanceCalibration(w, d)
    with pytest.raises(InvalidInput):
        cal.prior_weight = -1.0
    assert cal.prior_weight == PRIOR_WEIGHT  # a refused weight leaves the one before
    with pytest.raises(TypeError):  # a draft's arrays are numbers, not text
        cal.choose(np.array(["a", "b"]), *ok[1:], c, 0.0, 0.0)
    # A step's outcomes name nodes of the tree: a path beyond it or a parent after its child
    # is refused before anything is counted.
    tokens, parents = np.array([9, 10, 11], np.int32), np.array([-1, 0, 1], np.int32)
    scores, matched = np.array([1.0, 0.5, 0.2], np.float32), np.zeros(3, np.uint8)
    for path, emitted in (([0, 3], [10, 1]), ([0, 1], [10])):
        with pytest.raises(InvalidInput):
            cal.learn(tokens, parents, scores, matched, path, emitted)
    with pytest.raises(InvalidInput):
        cal.learn(tokens, np.array([-1, 2, 1], np.int32), scores, matched, [0], [10])
    with pytest.raises(InvalidInput, match="NaN"):
        cal.learn(tokens, parents, np.array([1.0, np.nan, 0.2]), matched, [0], [10])
    assert cal.offered.sum() == 0


def test_observe_reads_bools_numbers_and_lists_alike():
    cond, matched = np.array([0.1, 0.55, 0.97]), np.array([0, 2, 9])
    followed = np.array([False, True, True])
    got = []
    for f in (followed, followed.astype(np.float64), followed.astype(np.uint8).tolist()):
        cal = AcceptanceCalibration()
        cal.observe(cond.tolist(), matched.astype(np.int32), f)
        got.append((cal.offered.copy(), cal.accepted.copy()))
    for offered, accepted in got:
        assert offered.sum() == 3 and accepted.sum() == 2
        assert np.array_equal(offered, got[0][0]) and np.array_equal(accepted, got[0][1])


def reference_isotonic(v, w) -> list:
    """The non-decreasing sequence nearest `v` in `w`-weighted squares, pool-adjacent-
    violators as it was written in Python (until the core took the table over)."""
    vals, wts, sizes = [], [], []
    for x, y in zip(v, w):
        vals.append(x)
        wts.append(y)
        sizes.append(1)
        while len(vals) > 1 and vals[-2] > vals[-1]:
            y2, y1 = wts.pop(), wts.pop()
            x2, x1 = vals.pop(), vals.pop()
            n = sizes.pop() + sizes.pop()
            vals.append((x1 * y1 + x2 * y2) / (y1 + y2))
            wts.append(y1 + y2)
            sizes.append(n)
    return [x for x, n in zip(vals, sizes) for _ in range(n)]


def reference_cell(cond: float, matched: int) -> tuple[int, int]:
    """A node's `(group, band)` as numpy's searchsorted reads the edges (the Python rule
    until the core took it over): its band the last whose lower edge is at most `cond`, its
    group the number of match edges at most `matched`."""
    from lookahead.calibration import BAND_EDGES, MATCH_EDGES

    band = max(int(np.searchsorted(BAND_EDGES, cond, "right")) - 1, 0)
    return int(np.searchsorted(MATCH_EDGES, matched, "right")), band


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(
                st.floats(-1.0, 2.0),
                st.sampled_from([0.0, 0.05, 0.95, 1.0, -0.0, 5e-324, np.nextafter(0.1, 0)]),
            ),
            st.integers(-3, 300),
        ),
        max_size=20,
    )
)
def test_the_cores_cells_are_the_python_rule(nodes):
    """`cells` and `predict` read the table's axes as numpy's searchsorted does, edges
    included; a NaN score and ragged inputs are refused."""
    cal = AcceptanceCalibration()
    cond = np.array([c for c, _ in nodes], dtype=np.float64)
    matched = np.array([m for _, m in nodes], dtype=np.int64)
    groups, bands = cal.cells(cond, matched)
    want = [reference_cell(c, m) for c, m in nodes]
    assert list(zip(groups.tolist(), bands.tolist())) == want
    assert cal.predict(cond, matched).tolist() == [cal.table()[g, b] for g, b in want]
    with pytest.raises(ValueError, match="NaN"):
        cal.cells([0.5, float("nan")], [1, 1])
    with pytest.raises(ValueError, match="one length"):
        cal.predict([0.5], [1, 2])


@settings(max_examples=100, deadline=None)
@given(drafts(), st.integers(0, 2**31), st.booleans())
def test_the_cores_learning_is_the_python_rule(draft, seed, sampled):
    """A step learnt by the core (`learn`) counts what `outcomes` and `conditional` say, faded
    by `decay` a step, and its table is the prior-weighted rate made monotone by PAV."""
    from lookahead.calibration import DECAY, PRIOR_WEIGHT, conditional, outcomes

    scores, parents, matched, _ = draft
    rng = np.random.default_rng(seed)
    n = len(scores) + 1
    tokens = np.concatenate(([7], rng.integers(0, 4, n - 1))).astype(np.int32)
    tree_parents = np.concatenate(([-1], parents)).astype(np.int32)
    tree_scores = np.concatenate(([1.0], scores)).astype(np.float32)
    tree_matched = np.concatenate(([0], matched)).astype(np.uint8)
    cal = AcceptanceCalibration()
    offered, accepted = np.zeros((5, 12)), np.zeros((5, 12))
    for _ in range(3):
        # A path down the tree: each step to a random child, stopping at random.
        path = [0]
        while rng.uniform() < 0.7:
            kids = [j for j in range(1, n) if tree_parents[j] == path[-1]]
            if not kids:
                break
            path.append(int(rng.choice(kids)))
        emitted = [int(tokens[j]) for j in path[1:]] + [int(rng.integers(0, 5))]
        verified = int(rng.integers(1, n + 1)) if sampled else None
        if sampled:
            path = [j for j in path if j < verified]
            emitted = emitted[: len(path) - 1] + [int(rng.integers(0, 5))]
        got = cal.learn(tokens, tree_parents, tree_scores, tree_matched, path, emitted, verified)
        nodes, followed = outcomes(tokens, tree_parents, path, emitted, verified)
        assert got == (len(path) - 1 if sampled else int(sum(followed)))
        cond = conditional(tree_scores[1:], parents)[np.array(nodes, dtype=np.int64) - 1]
        offered *= DECAY
        accepted *= DECAY
        for c, m, f in zip(cond, tree_matched[nodes], followed):
            cell = reference_cell(c, m)
            offered[cell] += 1
            accepted[cell] += f
    assert np.allclose(cal.offered, offered, rtol=1e-12, atol=0)
    assert np.allclose(cal.accepted, accepted, rtol=1e-12, atol=0)
    w = cal.offered + PRIOR_WEIGHT
    v = (cal.accepted + PRIOR_WEIGHT * cal.prior) / w
    want = [reference_isotonic(a, b) for a, b in zip(v.tolist(), w.tolist())]
    assert np.allclose(cal.table(), want, rtol=1e-12, atol=0)


def test_calibration_follows_a_change_of_workload():
    rng = np.random.default_rng(2)
    cal = AcceptanceCalibration()
    for p_true in (0.9, 0.2):
        for _ in range(2000):
            sc = np.full(8, 0.55)
            cal.observe(sc, np.full(8, 2), rng.uniform(0, 1, 8) < p_true)
        assert abs(float(cal.predict(np.array([0.55]), np.array([2]))[0]) - p_true) < 0.05


# -- the curve --------------------------------------------------------------------------
def test_curve_interpolates_rows_and_context():
    m = CostModel((1, 4, 8), (160, 1760), ((1.0, 2.0, 4.0), (2.0, 3.0, 6.0)))
    c = m.curve(160)
    assert np.isnan(c[0]) and np.allclose(c[1:], [1.0, 4 / 3, 5 / 3, 2.0, 2.5, 3.0, 3.5, 4.0])
    assert np.allclose(m.curve(960)[[1, 4, 8]], [1.5, 2.5, 5.0])
    assert np.allclose(m.curve(967)[[1, 4, 8]], [1.5, 2.5, 5.0])  # read per 16 tokens
    assert np.allclose(m.curve(3360)[[1, 8]], [3.0, 8.0])  # linear past the longest
    assert np.allclose(m.curve(0)[[1, 8]], [1.0, 4.0])  # never below the shortest's
    assert m.relative(160) == [(1, 1.0), (4, 2.0), (8, 4.0)]
    assert CostModel.from_json(json.loads(json.dumps(m.to_json()))) == m
    # Three contexts: piecewise linear through the middle one.
    m3 = CostModel((1, 2), (0, 160, 320), ((1.0, 1.0), (2.0, 2.0), (2.5, 3.0)))
    assert np.allclose(m3.curve(80)[1:], [1.5, 1.5]) and np.allclose(m3.curve(240)[1:], [2.25, 2.5])
    assert np.allclose(m3.curve(480)[1:], [3.0, 4.0])


@st.composite
def grids(draw):
    """A CostModel's widths, contexts and seconds, as a measurement or a cost file gives."""
    widths = sorted(draw(st.sets(st.integers(2, 40), max_size=6)) | {1})
    contexts = sorted(draw(st.sets(st.integers(0, 4096), min_size=1, max_size=4)))
    secs = st.floats(1e-4, 10.0, allow_nan=False)
    seconds = [draw(st.lists(secs, min_size=len(widths), max_size=len(widths))) for _ in contexts]
    return tuple(widths), tuple(contexts), tuple(map(tuple, seconds))


@settings(max_examples=80, deadline=None)
@given(grids(), st.lists(st.integers(-10, 9000), min_size=1, max_size=8))
def test_the_cores_curve_is_the_numpy_rule(grid, contexts):
    # The core's CostGrid reads a curve exactly as numpy did (np.interp's rounding included).
    from reference_costs import reference_curve

    m = CostModel(*grid)
    for at in contexts:
        np.testing.assert_array_equal(m.curve(at), reference_curve(m, at))


@pytest.mark.parametrize(
    "args",
    [
        ((2, 4), (0,), ((1.0, 2.0),)),  # widths must start at one row
        ((1, 1), (0,), ((1.0, 2.0),)),
        ((1, 2), (5, 5), ((1.0, 2.0), (1.0, 2.0))),
        ((1, 2), (0,), ((1.0,),)),
        ((1, 2), (0,), ((1.0, -2.0),)),
        ((1, 2), (0,), ((1.0, float("nan")),)),
    ],
)
def test_bad_curves_are_refused(args):
    with pytest.raises(ValueError):
        CostModel(*args)


def test_bad_cost_files_are_refused():
    good = CostModel.from_rows({1: 1.0, 2: 2.0}).to_json()
    with pytest.raises(ValueError, match="format"):
        CostModel.from_json(dict(good, format=0))
    with pytest.raises(ValueError, match="malformed"):
        CostModel.from_json({"format": costs.COST_FORMAT})


def test_measured_curve_on_a_tiny_model():
    model = tiny_model("llama")
    m = measure_costs(model, widths=(1, 2, 5), contexts=(8, 40), repeats=1)
    assert m.widths == (1, 2, 5) and m.contexts == (8, 40)
    assert np.all(np.asarray(m.seconds) > 0)
    key = m.key
    assert key["dtype"] == "float32" and key["device"] == "cpu" and key["threads"] == 1
    # Contexts beyond the model's positions are capped (tiny models have few).
    n = model.config.max_position_embeddings
    m = measure_costs(model, widths=(1, 2), contexts=(n * 4,), repeats=1)
    assert m.contexts == (n - 2,)


def test_measured_widths_and_contexts_fit_the_positions_and_a_sliding_window():
    small = tiny_model("llama", max_position_embeddings=16)
    m = measure_costs(small, repeats=1)
    assert max(m.widths) <= 8 and max(m.contexts) + max(m.widths) <= 16
    windowed = tiny_model("qwen2", use_sliding_window=True, sliding_window=48, max_window_layers=0)
    m = measure_costs(windowed, repeats=1)  # a windowed cache keeps only 48 rows
    assert max(m.widths) <= 24 and max(m.contexts) + max(m.widths) <= 48
    tiny = tiny_model("llama", max_position_embeddings=1)
    assert measure_costs(tiny, repeats=1).widths == (1,)  # no room to draft at all


def test_curve_is_measured_once_and_kept(monkeypatch, tmp_path):
    monkeypatch.setenv("LOOKAHEAD_COST_DIR", str(tmp_path / "costs"))
    model = tiny_model("llama")
    lines = []
    first = load_or_measure(model, progress=lines.append)
    assert "measuring" in lines[0] and "kept in" in lines[-1]
    said = len(lines)
    (path,) = (tmp_path / "costs").iterdir()

    def no_measuring(*a, **k):
        raise AssertionError("measured again")

    monkeypatch.setattr(costs, "measure_costs", no_measuring)
    assert load_or_measure(model, progress=lines.append) == first
    assert len(lines) == said
    # Another thread count is another machine state: measured anew.
    monkeypatch.undo()
    monkeypatch.setenv("LOOKAHEAD_COST_DIR", str(tmp_path / "costs"))
    torch.set_num_threads(2)
    try:
        load_or_measure(model, progress=None)
    finally:
        torch.set_num_threads(1)
    assert len(list((tmp_path / "costs").iterdir())) == 2
    # A damaged file costs a measurement, said in one line, never the run.
    path.write_text('{"format": 1, "widths": [')
    lines.clear()
    load_or_measure(model, progress=lines.append)
    assert "re-measuring" in lines[0] and str(path) in lines[0]
    assert CostModel.from_json(json.loads(path.read_text())).key == first.key


def test_unwritable_cost_folder_still_gives_a_curve(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("LOOKAHEAD_COST_DIR", str(blocker / "costs"))
    lines = []
    m = load_or_measure(tiny_model("llama"), progress=lines.append)
    assert m.widths == costs.WIDTHS and "not kept" in lines[-1]


def test_a_kept_file_replaces_whatever_was_at_its_path(tmp_path):
    import os
    import stat
    import time

    curve = CostModel.from_rows({1: 0.01, 2: 0.015}, key={"model": "m"})
    fifo = tmp_path / "m.json"
    os.mkfifo(fifo)  # a FIFO (or a link) there is replaced, not written through or waited on
    t = time.perf_counter()
    assert costs.keep(curve, fifo) == f"kept in {fifo}"
    assert time.perf_counter() - t < 2.0 and stat.S_ISREG(fifo.lstat().st_mode)
    assert stat.S_IMODE(fifo.stat().st_mode) == 0o644
    assert CostModel.from_json(json.loads(fifo.read_text())) == curve
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"]  # no temporary file left


def test_refresh_measures_again(monkeypatch, tmp_path):
    monkeypatch.setenv("LOOKAHEAD_COST_DIR", str(tmp_path))
    model = tiny_model("llama")
    load_or_measure(model, progress=None)
    calls = []
    real = costs.measure_costs
    monkeypatch.setattr(costs, "measure_costs", lambda m: calls.append(1) or real(m))
    load_or_measure(model, refresh=True, progress=None)
    assert 1 <= len(calls) <= costs.MEASURE_TRIES  # a tiny model's curve is mostly noise


# -- the engine -------------------------------------------------------------------------
VOCAB = 128


@pytest.mark.parametrize(
    "name, rows",
    [
        ("flat", {1: 1.0, 64: 1.0}),
        ("steep", {1: 1.0, 64: 64.0}),
        ("knee", {1: 1.0, 4: 1.0, 64: 30.0}),
    ],
)
def test_greedy_output_is_plain_decoding_under_every_curve(name, rows, monkeypatch):
    # The curve as given, not corrected by the tiny model's forwards (tested apart).
    monkeypatch.setattr(LearnedCosts, "observe", lambda *a: None)
    model = tiny_model("llama")
    gen = LookaheadGenerator(model, cost_model=CostModel.from_rows(rows))
    rng = random.Random(11)
    nodes = []
    for _ in range(6):
        ids = repetitive_prompt(rng, VOCAB)
        ref = hf_generate(model, ids, 40)
        res = gen.generate(ids, max_new_tokens=40, eos_token_id=None)
        assert res.ids == ref, name
        nodes += res.stats.draft_nodes
    if name == "flat":
        assert max(nodes) > 8 and sum(n > 0 for n in nodes) > len(nodes) // 2
        assert gen.sizer.calibration[False].offered.sum() > 0
    elif name == "steep":  # no draft pays on a curve where every row costs a forward
        assert set(nodes) == {0}
    else:
        assert max(nodes) <= 3  # past 4 rows the curve climbs


def test_calibration_learns_from_verify_results(monkeypatch):
    monkeypatch.setattr(LearnedCosts, "observe", lambda *a: None)
    model = tiny_model("llama")
    # A knee at 4 rows: at most 3 nodes verified, the rest of each draft decided or not.
    gen = LookaheadGenerator(model, cost_model=CostModel.from_rows({1: 1.0, 4: 1.0, 64: 30.0}))
    rng = random.Random(3)
    res_nodes = []
    for _ in range(4):
        ids = repetitive_prompt(rng, VOCAB)
        res_nodes += gen.generate(ids, max_new_tokens=32, eos_token_id=None).stats.draft_nodes
    cal = gen.sizer.calibration[False]
    # Greedy steps count every child of an accepted node, verified or not (`outcomes`).
    assert sum(res_nodes) > 0 and 0 < cal.accepted.sum() < cal.offered.sum()
    assert gen.sizer.calibration[True].offered.sum() == 0  # greedy steps teach the greedy table
    # Sampled steps teach their own table, from the nodes they verified.
    for seed in range(3):
        gen.generate(ids, max_new_tokens=32, eos_token_id=None, do_sample=True, seed=seed)
    assert (
        0 < gen.sizer.calibration[True].accepted.sum() <= gen.sizer.calibration[True].offered.sum()
    )


def test_budget_caps_the_cost_aware_choice(monkeypatch):
    monkeypatch.setattr(LearnedCosts, "observe", lambda *a: None)
    model = tiny_model("llama")
    flat = CostModel.from_rows({1: 1.0, 64: 1.0})
    gen = LookaheadGenerator(model, budget=3, cost_model=flat)
    ids = repetitive_prompt(random.Random(4), VOCAB)
    res = gen.generate(ids, max_new_tokens=32, eos_token_id=None)
    assert res.ids == hf_generate(model, ids, 32) and max(res.stats.draft_nodes) <= 3


def test_sampling_under_the_cost_aware_choice_is_the_seeds_plain_sampling(monkeypatch):
    monkeypatch.setattr(LearnedCosts, "observe", lambda *a: None)
    model = tiny_model("llama")
    knee = CostModel.from_rows({1: 1.0, 4: 1.0, 64: 30.0})  # drafts of 0 to 3 nodes
    cost_aware = LookaheadGenerator(model, cost_model=knee)
    plain = LookaheadGenerator(model, budget=0)  # plain decoding through the same path
    rng = random.Random(9)
    drafted = 0
    for seed in range(4):
        ids = repetitive_prompt(rng, VOCAB)
        kw = dict(max_new_tokens=32, eos_token_id=None, do_sample=True, seed=seed)
        res = cost_aware.generate(ids, **kw)
        assert res.ids == plain.generate(ids, **kw).ids
        drafted += sum(n > 0 for n in res.stats.draft_nodes)
    assert drafted > 0


def test_default_generator_measures_on_first_use(monkeypatch, tmp_path):
    monkeypatch.setenv("LOOKAHEAD_COST_DIR", str(tmp_path))
    model = tiny_model("llama")
    gen = LookaheadGenerator(model)
    assert gen.sizer.learned is None and not any(tmp_path.iterdir())  # nothing measured yet
    ids = repetitive_prompt(random.Random(6), VOCAB)
    res = gen.generate(ids, max_new_tokens=24, eos_token_id=None)
    assert res.ids == hf_generate(model, ids, 24)
    assert isinstance(gen.cost_model, CostModel) and len(list(tmp_path.iterdir())) == 1


def test_outcomes_reach_past_the_verified_prefix():
    from lookahead.calibration import outcomes

    # root 0 -> 1 (a), 2 (b); 1 -> 3 (c), 4 (d); 3 -> 5 (e); 2 -> 6 (f); 4 -> 7 (g)
    tokens = [9, 10, 11, 12, 13, 14, 15, 16]
    parents = [-1, 0, 0, 1, 1, 3, 2, 4]
    # Greedy, nodes 0-2 verified: node 1 accepted, the target's argmax after it is 13.
    # The children of accepted nodes: 1 followed, 2 not; 3 not (not the argmax after 1),
    # 4 followed though never verified. Below rejected or unverified nodes: nothing.
    assert outcomes(tokens, parents, path=[0, 1], emitted=[10, 13]) == ([1, 2, 3, 4], [1, 0, 0, 1])
    # The root alone verified: its children are decided by the bonus token, nothing below.
    assert outcomes(tokens, parents, path=[0], emitted=[11]) == ([1, 2], [0, 1])
    # Sampled: only verified nodes are known, followed iff on the accepted path.
    sampled = outcomes(tokens, parents, path=[0, 1], emitted=[10, 13], verified=3)
    assert sampled == ([1, 2], [1, 0])


def test_outcomes_do_not_bias_deep_nodes():
    # A chain whose every level is followed with p = 0.9 where its parent was, the root
    # verified alone or with up to two levels: what is learnt of each level must be 0.9.
    from lookahead.calibration import outcomes

    rng = np.random.default_rng(5)
    seen = np.zeros(3)
    hits = np.zeros(3)
    for _ in range(20000):
        depth = 0  # how far the target agrees with the chain
        while depth < 3 and rng.uniform() < 0.9:
            depth += 1
        verified = int(rng.integers(1, 4))  # the root, and up to 2 levels below it
        accepted = min(depth, verified - 1)
        path = list(range(accepted + 1))
        truth = [10, 11, 12]
        # The argmax after the last accepted node: the chain's next token iff it agrees.
        bonus = truth[accepted] if depth > accepted else 99
        emitted = truth[:accepted] + [bonus]
        nodes, followed = outcomes([9, *truth], [-1, 0, 1, 2], path, emitted)
        for j, f in zip(nodes, followed):
            seen[j - 1] += 1
            hits[j - 1] += f
    assert np.allclose(hits / seen, [0.9, 0.9, 0.9], atol=0.02)


def test_measured_forwards_correct_the_curve():
    model = tiny_model("llama")
    # A curve ~1000x slower than a tiny model's forwards: the engine's own forwards pull the
    # curve its drafts are sized by down to what they measure.
    prior = CostModel.from_rows({1: 1.0, 64: 1.0})
    gen = LookaheadGenerator(model, cost_model=prior)
    rng = random.Random(8)
    steps = 0
    for _ in range(3):
        ids = repetitive_prompt(rng, VOCAB)
        res = gen.generate(ids, max_new_tokens=32, eos_token_id=None)
        assert res.ids == hf_generate(model, ids, 32)
        steps += res.stats.steps
    learned = gen.sizer.learned
    assert learned.count == steps and learned.prior is prior
    measured = learned.measured(100)
    assert measured and all(sec < 0.05 for sec, _n in measured.values())
    assert learned.curve(100)[1] < 0.05
