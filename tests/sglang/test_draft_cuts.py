"""Per-request control (`request_control`) and the cuts it and grammars make to a batch's
drafts before the verify (`draft_cuts`), without a server."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lookahead.sglang.draft_cuts import cut_drafts, grammar_keeps
from lookahead.sglang.request_control import RequestControl, control_of, parse_control

WIDTH = 8


@pytest.mark.parametrize(
    "params, want",
    [
        (None, RequestControl()),
        ({"other": 1}, RequestControl()),
        ({"lookahead": None}, RequestControl()),
        ({"lookahead": {"enabled": False}}, RequestControl(enabled=False)),
        ({"lookahead": {"budget": 7}}, RequestControl(budget=7)),
        ({"lookahead": {"budget": 0}}, RequestControl(budget=0)),
        ({"lookahead": {"namespace": "t" * 128}}, RequestControl(namespace="t" * 128)),
    ],
)
def test_good_controls(params, want):
    assert parse_control(params, WIDTH) == want


@pytest.mark.parametrize(
    "raw",
    [
        "on",
        [1],
        {"enabled": 1},
        {"enabled": None},
        {"budget": 8},
        {"budget": -1},
        {"budget": True},
        {"budget": 2.0},
        {"namespace": ""},
        {"namespace": "t" * 129},
        {"namespace": 3},
        {"budgets": 2},
    ],
)
def test_bad_controls_raise_one_line(raw):
    with pytest.raises(ValueError, match=r'custom_params\["lookahead"\]') as e:
        parse_control({"lookahead": raw}, WIDTH)
    assert "\n" not in str(e.value)


def test_an_unchecked_bad_control_drafts_nothing():
    req = SimpleNamespace(sampling_params=SimpleNamespace(custom_params={"lookahead": "x"}))
    assert not control_of(req, WIDTH).drafts


def batch_draft(rows):
    """A BatchDraft-like object of (tokens, parents) rows, NGRAM's padding to WIDTH."""
    b = len(rows)
    tokens = np.zeros((b, WIDTH), np.int32)
    parents = np.zeros((b, WIDTH), np.int32)
    scores = np.zeros((b, WIDTH), np.float32)
    num = np.zeros(b, np.int32)
    matched = np.zeros((b, WIDTH), np.uint8)
    for i, (t, p) in enumerate(rows):
        n = len(t)
        tokens[i, :n], parents[i, :n], num[i] = t, p, n
        scores[i, 1:n] = np.linspace(1, 0.5, n - 1)
        matched[i, 1:n] = np.arange(1, n)  # node j: j
    return SimpleNamespace(
        tokens=tokens, parents=parents, scores=scores, num_nodes=num, matched=matched
    )


def req(control=None, grammar=None):
    params = {"lookahead": control} if control is not None else None
    return SimpleNamespace(sampling_params=SimpleNamespace(custom_params=params), grammar=grammar)


TREE = ([9, 1, 2, 3, 4, 5], [-1, 0, 1, 0, 3, 2])  # 0 -> 1 -> 2 -> 5; 0 -> 3 -> 4


def test_switches_and_budgets_cut_rows_to_a_prefix():
    bd = batch_draft([TREE, TREE, TREE, TREE])
    reqs = [req(), req({"enabled": False}), req({"budget": 2}), req({"budget": 0})]
    assert cut_drafts(bd, reqs, WIDTH) == 5 + 3 + 5
    assert bd.num_nodes.tolist() == [6, 1, 3, 1]
    assert bd.tokens[2, :3].tolist() == [9, 1, 2] and bd.parents[2, :3].tolist() == [-1, 0, 1]
    for row in (1, 2, 3):  # padding as NGRAM pads: token 0, children of the root, score 0
        n = bd.num_nodes[row]
        assert (bd.tokens[row, n:] == 0).all() and (bd.parents[row, n:] == 0).all()
        assert (bd.scores[row, n:] == 0).all() and (bd.matched[row, n:] == 0).all()


class Matcher:
    """A grammar matcher over token sequences: accepts a token if the accepted sequence
    stays a prefix of one of `allowed`; `rollback` as xgrammar's."""

    def __init__(self, allowed, done_after=None):
        self.allowed = [tuple(a) for a in allowed]
        self.seq: list[int] = []
        self.done_after = done_after

    def is_terminated(self):
        return self.done_after is not None and len(self.seq) >= self.done_after

    def accept_token(self, tok):
        nxt = (*self.seq, tok)
        if any(a[: len(nxt)] == nxt for a in self.allowed):
            self.seq.append(tok)
            return True
        return False

    def rollback(self, k):
        del self.seq[len(self.seq) - k :]


def test_a_grammar_prunes_forbidden_nodes_and_their_subtrees():
    m = Matcher([[3, 4], [1, 7]])
    bd = batch_draft([TREE])
    cut = cut_drafts(bd, [req(grammar=SimpleNamespace(matcher=m, vocab_size=100))], WIDTH)
    # Kept: root, 1 (then 2 forbidden, so 5 goes too), 3, 4.
    assert cut == 2 and bd.num_nodes[0] == 4
    assert bd.tokens[0, :4].tolist() == [9, 1, 3, 4]
    assert bd.parents[0, :4].tolist() == [-1, 0, 0, 2]
    assert bd.matched[0].tolist() == [0, 1, 3, 4, 0, 0, 0, 0][:WIDTH]  # moved with their nodes
    assert m.seq == []  # the matcher is left as it was found


def test_a_terminated_grammar_drafts_nothing():
    m = Matcher([[1, 2, 5]], done_after=0)
    bd = batch_draft([TREE])
    cut_drafts(bd, [req(grammar=SimpleNamespace(matcher=m, vocab_size=100))], WIDTH)
    assert bd.num_nodes[0] == 1


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_grammar_keeps_exactly_the_accepted_paths(data):
    n = data.draw(st.integers(1, WIDTH))
    parents = [-1] + [data.draw(st.integers(0, i - 1)) for i in range(1, n)]
    tokens = [0] + [data.draw(st.integers(0, 3)) for _ in range(1, n)]
    allowed = data.draw(st.lists(st.lists(st.integers(0, 3), max_size=4), max_size=4))
    m = Matcher(allowed)
    allowed = m.allowed

    def path(i):
        out = []
        while i != 0:
            out.append(tokens[i])
            i = parents[i]
        return tuple(reversed(out))

    keep = grammar_keeps(np.array(tokens), np.array(parents), n, m, vocab=100)
    want = [0] + [i for i in range(1, n) if any(a[: len(path(i))] == path(i) for a in allowed)]
    assert (keep if keep is not None else list(range(n))) == want
    assert m.seq == []


def test_a_real_xgrammar_matcher_prunes_as_its_bitmask_would():
    xgr = pytest.importorskip("xgrammar", reason="xgrammar comes with requirements/sglang-test.txt")
    vocab = [chr(97 + i) for i in range(26)]  # one token per letter
    info = xgr.TokenizerInfo(vocab)
    compiled = xgr.GrammarCompiler(info).compile_regex("(ab)+c")
    m = xgr.GrammarMatcher(compiled)
    tok = {c: i for i, c in enumerate(vocab)}
    # root -> a -> b -> c ; root -> b ; root -> a -> a
    tokens = np.array([0, tok["a"], tok["b"], tok["c"], tok["b"], tok["a"]])
    parents = np.array([-1, 0, 1, 2, 0, 1])
    assert grammar_keeps(tokens, parents, 6, m, vocab=26) == [0, 1, 2, 3]
    assert m.accept_token(tok["a"])  # still at the start: "a" first


def test_a_matcher_that_raises_mid_walk_is_rolled_back_and_the_row_kept():
    class Raising(Matcher):
        def accept_token(self, tok):
            if len(self.seq) == 2:
                raise RuntimeError("the grammar backend failed")
            return super().accept_token(tok)

    m = Raising([[1, 2, 5], [3, 4]])
    bd = batch_draft([TREE])
    assert cut_drafts(bd, [req(grammar=SimpleNamespace(matcher=m, vocab_size=100))], WIDTH) == 0
    assert m.seq == [] and bd.num_nodes[0] == len(TREE[0])


def test_namespace_names_stay_small_and_valid():
    from lookahead.sglang.drafter import LONG_KEY, LookaheadDrafter

    with pytest.raises(ValueError, match="namespace must be a string"):
        parse_control({"lookahead": {"namespace": "\ud800"}}, WIDTH)
    assert LookaheadDrafter.namespace_of_key("tenant-a") == "key:tenant-a"
    long = LookaheadDrafter.namespace_of_key("x" * (LONG_KEY + 1))
    assert long.startswith("key#") and len(long) == 4 + 64
    assert LookaheadDrafter.namespace_of_key("\ud800").startswith("key#")
