"""Drafts of `LookaheadCache` equal those of the brute-force model in tests/reference_trie.py.

Comparison: with a capacity large enough that nothing is evicted, after every operation of
a random sequence (start / extend / draft / finish / add_history over two namespaces), the
draft of every live request has exactly the reference's tokens and parents, and its scores
equal the reference's float64 path probabilities rounded to float32.
"""

from __future__ import annotations

import numpy as np
import reference_trie
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lookahead import LookaheadCache
from reference_trie import ReferenceCache

# Mostly a small alphabet (n-grams repeat, trees branch); sometimes squares up to 144 with a
# skew. Nodes with more than 8 children (ranked side tables) come from the `hub` op.
token = st.one_of(st.integers(0, 3), st.integers(0, 12).map(lambda i: i * i))
tokens = st.lists(token, min_size=1, max_size=24)
namespaces = st.sampled_from(["default", "b"])

op = st.one_of(
    st.tuples(st.just("start"), st.integers(0, 3), tokens, namespaces),
    st.tuples(st.just("extend"), st.integers(0, 3), tokens),
    st.tuples(st.just("finish"), st.integers(0, 3), st.sampled_from([None, True, False])),
    st.tuples(st.just("history"), st.lists(tokens, max_size=3), namespaces),
    st.tuples(st.just("draft"), st.integers(0, 3), st.integers(1, 12), st.booleans()),
    # History where token 2 is followed by 9-20 distinct tokens (a ranked, wide n-gram),
    # then a live request ends on 2 and drafts from it.
    st.tuples(
        st.just("hub"),
        st.integers(0, 3),
        st.lists(st.integers(50, 90), min_size=9, max_size=20, unique=True),
        namespaces,
    ),
)

weights = st.sampled_from([(1.0, 1.0), (1.0, 0.0), (0.0, 1.0), (2.0, 0.5), (0.3, 1.7)])
# The default, none, and skips that short n-grams reach: (2, 3) lets the history answer
# again at 4 tokens and more (the default, at 7 and more, needs depth 8 or 9).
skips = st.sampled_from([(3, 6), None, (1, 1), (2, 2), (2, 3), (1, 3)])


def assert_same_draft(cache, ref, rid, budget, multi):
    got = cache.draft(rid, budget=budget, multi_branch=multi)
    want_t, want_p, want_s = ref.draft(rid, budget, multi)
    where = f"request {rid}, budget {budget}, multi_branch={multi}"
    assert got.tokens.tolist() == want_t, where
    assert got.parents.tolist() == want_p, where
    np.testing.assert_array_equal(got.scores, np.asarray(want_s, dtype=np.float32), err_msg=where)
    assert got.num_nodes == len(want_t) <= budget + 1


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    depth=st.integers(2, 9),
    w=weights,
    keep=st.booleans(),
    background=st.booleans(),
    skip=skips,
    ops=st.lists(op, max_size=25),
)
def test_drafts_match_reference(depth, w, keep, background, skip, ops):
    kw = dict(
        max_depth=depth,
        own_weight=w[0],
        history_weight=w[1],
        keep_prompt_as_history=keep,
        history_skip=skip,
    )
    cache = LookaheadCache(capacity_nodes=1_000_000, background_indexing=background, **kw)
    ref = ReferenceCache(**kw)
    for o in ops:
        kind = o[0]
        if kind == "start" and o[1] not in ref.requests:
            cache.start_request(o[1], o[2], namespace=o[3])
            ref.start_request(o[1], o[2], namespace=o[3])
        elif kind == "extend" and o[1] in ref.requests:
            cache.extend(o[1], o[2])
            ref.extend(o[1], o[2])
        elif kind == "finish" and o[1] in ref.requests:
            cache.finish_request(o[1], keep_prompt=o[2])
            ref.finish_request(o[1], keep_prompt=o[2])
        elif kind == "history":
            cache.add_history(o[1], namespace=o[2])
            ref.add_history(o[1], namespace=o[2])
        elif kind == "draft" and o[1] in ref.requests:
            assert_same_draft(cache, ref, o[1], o[2], o[3])
        elif kind == "hub":
            texts = [[2, x, 2, x] for x in o[2]]
            cache.add_history(texts, namespace=o[3])
            ref.add_history(texts, namespace=o[3])
            if o[1] in ref.requests:
                cache.extend(o[1], [2])
                ref.extend(o[1], [2])
                assert_same_draft(cache, ref, o[1], 12, True)
        cache.check_invariants()
    for rid in sorted(ref.requests):
        for budget, multi in ((1, False), (6, False), (6, True), (12, True)):
            assert_same_draft(cache, ref, rid, budget, multi)
    assert cache.stats()["evicted_nodes"] == 0


# After the hub token 0 come up to 120 others: n-grams with more than TOP_K continuations,
# many tied, in the prompt's trie and the history's alike.
wide_text = st.lists(st.one_of(st.just(0), st.integers(1, 120)), min_size=60, max_size=300)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    depth=st.integers(2, 4),
    w=weights,
    skip=skips,
    prompt=wide_text,
    history=st.lists(wide_text, max_size=2),
    output=st.lists(st.one_of(st.just(0), st.integers(1, 120)), min_size=1, max_size=40),
)
def test_wide_ngrams_match_reference(depth, w, skip, prompt, history, output):
    kw = dict(max_depth=depth, own_weight=w[0], history_weight=w[1], history_skip=skip)
    cache = LookaheadCache(capacity_nodes=1_000_000, background_indexing=False, **kw)
    ref = ReferenceCache(**kw)
    for c in (cache, ref):
        c.add_history(history)
        c.start_request(0, prompt)
        c.extend(0, output)
        c.extend(0, [0])  # end on the hub: the root has its widest choice
    for budget, multi in ((1, False), (16, True), (40, True), (33, False)):
        assert_same_draft(cache, ref, 0, budget, multi)
    for c in (cache, ref):
        c.extend(0, [0])  # "0 0": a wide root that backs off to the wider "0"
    for budget, multi in ((1, False), (16, True), (40, True)):
        assert_same_draft(cache, ref, 0, budget, multi)


def test_a_trie_offers_its_top_k_continuations(monkeypatch):
    # After 0: the prompt has 200..240 and 999 once each, the history 1..32 three times each
    # and 999 twice. 999 ranks last in both (below TOP_K = 16th): neither trie offers it,
    # though scoring every continuation would put it first ((4/84 + 2/131) / 5 against
    # 200's 4/84 / 5).
    prompt = [x for t in [999, *range(200, 241)] for x in (0, t)] + [0]
    history = [x for t in [*range(1, 33)] * 3 + [999, 999] for x in (0, t)]
    cache = LookaheadCache(max_depth=3, background_indexing=False)
    ref = ReferenceCache(max_depth=3)
    for c in (cache, ref):
        c.add_history([history])
        c.start_request(0, prompt)
    assert cache.draft(0, budget=1, multi_branch=False).tokens.tolist() == [0, 200]
    assert_same_draft(cache, ref, 0, 1, False)
    monkeypatch.setattr(reference_trie, "TOP_K", 10**9)
    assert ref.draft(0, 1, False)[0] == [0, 999]


def test_backoff_excludes_unoffered_continuations_of_the_longer_suffix():
    # "1 2" is followed by 100..119 once each: 20 continuations, 16 offered (100..115). "2"
    # is followed by 119 101 times: the backoff level's best, but 119 continues "1 2" (its
    # score is in that level's mass, not in the escape), so no budget may draft it there.
    history = [[1, 2, t, 7] for t in range(100, 120)] + [[2, 119, 7]] * 100
    kw = dict(max_depth=3)
    cache = LookaheadCache(background_indexing=False, **kw)
    ref = ReferenceCache(**kw)
    for c in (cache, ref):
        c.add_history(history)
        c.start_request(0, [5, 6, 1, 2])
    for budget, multi in ((1, False), (4, True), (16, True), (40, True)):
        assert_same_draft(cache, ref, 0, budget, multi)
        d = cache.draft(0, budget=budget, multi_branch=multi)
        assert d.tokens[1] == 100 and 119 not in d.tokens[d.parents == 0].tolist()


def test_batch_rows_equal_single_drafts():
    cache = LookaheadCache(max_depth=4, background_indexing=False)
    rng = np.random.default_rng(0)
    for rid in range(40):
        cache.start_request(rid, rng.integers(0, 5, size=40))
        cache.extend(rid, rng.integers(0, 5, size=7))
    for multi in (True, False):
        # 40 requests on 2 threads (the core splits batches of 32+).
        bd = cache.draft_batch(list(range(40)), budget=5, multi_branch=multi, threads=2)
        assert bd.tokens.shape == bd.parents.shape == bd.scores.shape == (40, 6)
        for rid in range(40):
            d = cache.draft(rid, budget=5, multi_branch=multi)
            row = bd.row(rid)
            assert row.num_nodes == d.num_nodes
            np.testing.assert_array_equal(row.tokens, d.tokens)
            np.testing.assert_array_equal(row.parents, d.parents)
            np.testing.assert_array_equal(row.scores, d.scores)
            n = d.num_nodes
            assert (bd.tokens[rid, n:] == 0).all() and (bd.parents[rid, n:] == -1).all()
            assert (bd.scores[rid, n:] == 0).all()


def test_rematch_reaches_past_a_count_zero_prefix_node():
    # The history holds "1 1" and "1 1 1" only as count-0 prefixes of the windows that end at
    # the outputs 4 and 5 (prompts are not kept): after backing off to "1" and drafting 1,
    # the state's history is untracked, yet "1 1 1" continues there (-> 4); the fresh match
    # must find that 3-gram, not stop at "1 1" (found by review, session 8).
    kw = dict(max_depth=5, own_weight=1.0, history_weight=1.0, history_skip=None)
    cache = LookaheadCache(capacity_nodes=100_000, background_indexing=False, **kw)
    ref = ReferenceCache(**kw)
    for c in (cache, ref):
        for rid, prompt, out in (("A", [1, 1, 1], [4]), ("C", [2, 1, 1], [5])):
            c.start_request(rid, prompt)
            c.extend(rid, out)
            c.finish_request(rid)
        c.start_request("B", [3, 1, 1])
    assert_same_draft(cache, ref, "B", 4, True)
    assert cache.draft("B", budget=4).scores.tolist()[-1] == 0.0625


def test_rematch_finds_an_ngram_the_state_did_not_track():
    # "9 0" ends the prompt and occurs in the history only as the prefix of "9 0 0" (count 0):
    # the state after drafting 0 tracks the prompt alone, which does not continue it, but the
    # fresh match must still find "9 0" -> 0 in the history (not fall back to "0").
    kw = dict(max_depth=3, own_weight=1.0, history_weight=1.0)
    cache = LookaheadCache(capacity_nodes=1_000, background_indexing=False, **kw)
    ref = ReferenceCache(**kw)
    for c in (cache, ref):
        c.start_request(0, [9, 0])
        c.extend(0, [0, 9])
    assert_same_draft(cache, ref, 0, 6, False)
    assert cache.draft(0, budget=2, multi_branch=False).scores.tolist() == [1.0, 0.5, 0.25]
