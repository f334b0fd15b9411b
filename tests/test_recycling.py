"""Recycled predictions: the cache's table and merged drafts, the engine feeding them (still
lossless), the prefill's rows, and the simulator's replay of them."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from bounded import quickly
from hypothesis import given, settings
from hypothesis import strategies as st
from lookahead import InvalidInput, LookaheadCache
from lookahead.hf import LookaheadGenerator
from lookahead.hf.kv import new_cache
from tiny_models import FAMILIES, hf_generate, repetitive_prompt, tiny_model

VOCAB = 128


def rows(ids, probs):
    return np.array(ids, dtype=np.int64), np.array(probs, dtype=np.float32)


def test_a_recycled_prediction_is_drafted_where_no_text_had_it():
    c = LookaheadCache(recycle_k=4, background_indexing=False)
    c.start_request(1, [100, 101])
    # The target chose 7 after 101 (8 its second guess), then 9 after 7.
    c.extend(1, [7, 9], *rows([[7, 8], [9, 3]], [[0.75, 0.25], [0.5, 0.5]]))
    c.extend(1, [5, 101])
    d = c.draft(1, 4)
    assert 8 in d.tokens[1:].tolist()
    assert c.stats()["recycled_keys"] == 4  # per row: the token, and the pair before it
    plain = LookaheadCache(background_indexing=False)
    plain.start_request(1, [100, 101])
    plain.extend(1, [7, 9], *rows([[7, 8], [9, 3]], [[0.75, 0.25], [0.5, 0.5]]))
    plain.extend(1, [5, 101])
    assert 8 not in plain.draft(1, 4).tokens.tolist()
    assert plain.stats()["recycled_keys"] == 0


def test_recycle_keys_rows_by_the_token_before():
    c = LookaheadCache(recycle_k=2, background_indexing=False)
    c.start_request(1, [50])
    # Row 0 follows token 20 (after 10), row 1 follows 21 (after 10): a tree's two children.
    c.recycle(1, [20, 21], *rows([[30], [31]], [[0.9], [0.9]]), after=[10, 10])
    c.extend(1, [10, 21])
    assert c.draft(1, 2, multi_branch=False).tokens.tolist()[:2] == [21, 31]
    # As a sequence: row j follows token_ids[j].
    c.recycle(1, [40, 41], *rows([[41], [42]], [[0.9], [0.9]]))
    c.extend(1, [40, 41])
    assert c.draft(1, 1, multi_branch=False).tokens.tolist() == [41, 42]


@pytest.mark.parametrize(
    ("ids", "probs", "match"),
    [
        ([[1, 2]], [[0.5]], "one shape"),
        ([[1]], [[1.5]], r"\[0, 1\]"),
        ([[1]], [[float("nan")]], r"\[0, 1\]"),
        ([[-1]], [[0.5]], r"\[0, 2\*\*32\)"),
        ([[1.0]], [[0.5]], "integers"),
        ([1], [0.5], "2-D"),
        (np.zeros((1, 0), dtype=np.int64), np.zeros((1, 0), dtype=np.float32), "1 <= k <= 4096"),
        ([[1], [2]], [[0.5], [0.5]], r"one row per token \(1\), got 2"),  # two rows, one token
    ],
)
def test_bad_predictions_are_refused_before_anything_changes(ids, probs, match):
    c = LookaheadCache(recycle_k=2, background_indexing=False)
    c.start_request(1, [5, 6])
    with pytest.raises(InvalidInput, match=match):
        c.extend(1, [7], np.asarray(ids), np.asarray(probs))
    assert c.stats()["recycled_keys"] == 0
    with pytest.raises(InvalidInput, match="both or neither"):
        c.extend(1, [7], [[1]])
    with pytest.raises(InvalidInput, match="before them"):
        c.recycle(1, [7, 8], *rows([[1], [2]], [[0.5], [0.5]]), after=[3])


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"recycle_k": 65}, "recycle_k"),
        ({"recycle_k": -1}, "recycle_k"),
        ({"recycle_slots": 1 << 29}, "recycle_slots"),
        ({"recycle_weight": -0.5}, "recycle_weight"),
        ({"recycle_weight": 0.0}, "recycle_k = 0 turns recycling off"),
        ({"recycle_weight": "high"}, "recycle_weight"),
    ],
)
def test_bad_recycle_settings_are_refused(kw, match):
    with pytest.raises(InvalidInput, match=match):
        LookaheadCache(**kw)


def test_settings_are_reported():
    c = LookaheadCache(recycle_k=3, recycle_slots=10, recycle_weight=0.25)
    assert {k: c.config[k] for k in ("recycle_k", "recycle_slots", "recycle_weight")} == {
        "recycle_k": 3,
        "recycle_slots": 10,
        "recycle_weight": 0.25,
    }
    assert LookaheadCache().config["recycle_k"] == 0  # off unless asked for


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    k=st.integers(1, 6),
    slots=st.integers(1, 300),
    budget=st.integers(1, 24),
    multi=st.booleans(),
)
def test_merged_drafts_keep_every_invariant_and_the_table_its_bound(seed, k, slots, budget, multi):
    rng = np.random.default_rng(seed)
    c = LookaheadCache(max_depth=5, recycle_k=k, recycle_slots=slots, background_indexing=False)
    for rid in range(3):
        c.start_request(rid, rng.integers(0, 12, size=int(rng.integers(1, 30))).tolist())
    for _ in range(60):
        rid = int(rng.integers(0, 3))
        n = int(rng.integers(1, 5))
        new = rng.integers(0, 12, size=n)
        kk = int(rng.integers(1, 9))
        p = rng.dirichlet(np.ones(kk + 1), size=n)[:, :kk].astype(np.float32)
        c.extend(rid, new, rng.integers(0, 12, size=(n, kk)), p)
        if rng.random() < 0.3:
            c.recycle(rid, new, rng.integers(0, 12, size=(n, kk)), p, after=rng.integers(0, 12, n))
        d = c.draft(rid, budget, multi_branch=multi)
        nodes = d.num_nodes
        assert 1 <= nodes <= budget + 1
        assert d.parents[0] == -1
        assert all(0 <= d.parents[i] < i for i in range(1, nodes))
        s = d.scores
        assert np.all((s[1:] > 0) & (s[1:] <= 1))
        assert all(s[i] <= s[d.parents[i]] for i in range(1, nodes))  # a path only loses
        if multi:
            assert np.all(np.diff(s[1:]) <= 0)  # best first
        assert c.stats()["recycled_keys"] <= slots
        c.check_invariants()


def test_recycled_memory_is_bounded_and_counted():
    def fed(k):
        c = LookaheadCache(recycle_k=k, recycle_slots=1000, background_indexing=False)
        c.start_request(1, [1, 2])
        rng = np.random.default_rng(0)
        for _ in range(400):
            p = np.full((16, 8), 0.1, dtype=np.float32)
            c.extend(1, rng.integers(0, 50_000, size=16), rng.integers(0, 50_000, (16, 8)), p)
        return c.stats()

    on, off = fed(8), fed(0)
    # 12,800 keys written into 1,000 slots (a key written again leaves a hole behind).
    assert 990 <= on["recycled_keys"] <= 1000
    # The same tries either way; 1,000 rows of 8 (id, p) pairs, keys and map on top.
    grown = on["bytes"] - off["bytes"]
    assert 64 * 1000 <= grown < 200 * 1000


@pytest.fixture(scope="module")
def family_model(request):
    return request.param, tiny_model(request.param)


@pytest.mark.usefixtures("verify_every_draft", "one_torch_thread")
@pytest.mark.parametrize("family_model", FAMILIES, indirect=True)
@pytest.mark.parametrize("recycle", [True, "path"])
def test_greedy_with_recycling_equals_generate(family_model, recycle):
    family, model = family_model
    gen = LookaheadGenerator(model, budget=12, recycle=recycle)
    rng = random.Random(99)
    for i in range(8):
        ids = repetitive_prompt(rng, VOCAB)
        ref = hf_generate(model, ids, 24)
        res = gen.generate(ids, max_new_tokens=24, eos_token_id=None)
        assert res.ids == ref, f"{family} prompt {i}: {ids}"
    assert gen.cache.stats()["recycled_keys"] > 0


@pytest.mark.usefixtures("verify_every_draft", "one_torch_thread")
def test_recycled_drafts_are_accepted_where_the_trie_has_nothing():
    # A fresh cache per prompt, so only this prompt's text and predictions can draft; the
    # tiny model's greedy output runs into loops the recycled rows see before the trie does.
    model = tiny_model("llama", seed=4)
    rng = random.Random(5)
    gained = 0
    for _ in range(6):
        ids = repetitive_prompt(rng, VOCAB)
        plain = LookaheadGenerator(model, budget=12).generate(ids, max_new_tokens=40)
        rec = LookaheadGenerator(model, budget=12, recycle=True).generate(ids, max_new_tokens=40)
        assert rec.ids == plain.ids
        gained += sum(rec.stats.accepted) - sum(plain.stats.accepted)
    assert gained > 0


@pytest.mark.usefixtures("verify_every_draft", "one_torch_thread")
def test_seeded_sampling_with_recycling_is_plain_sampling():
    model = tiny_model("llama", seed=21, vocab_size=12, init_std=0.15)
    prompt = [3, 4, 5, 3, 4, 5, 3, 4, 5, 3, 4]
    kw = dict(max_new_tokens=30, do_sample=True, temperature=0.7, seed=123, eos_token_id=None)
    gen = LookaheadGenerator(model, recycle=True, min_draft_score=0)
    runs = [gen.generate(prompt, **kw) for _ in range(3)]
    plain = LookaheadGenerator(model, budget=0).generate(prompt, **kw)
    assert all(r.ids == plain.ids for r in runs)
    assert sum(runs[-1].stats.accepted) > 0


def test_recycle_option_is_checked():
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="recycle must be"):
        LookaheadGenerator(model, recycle="all", budget=4)
    with pytest.raises(ValueError, match="recycle_k > 0"):
        LookaheadGenerator(model, cache=LookaheadCache(), recycle=True, budget=4)
    gen = LookaheadGenerator(model, cache=LookaheadCache(recycle_k=2), budget=4)
    assert gen._recycle_k == 2  # a recycling cache given is fed
    off = LookaheadGenerator(model, cache=LookaheadCache(recycle_k=2), recycle=False, budget=4)
    assert off._recycle_k == 0


def test_predictions_from_torch_tensors_of_any_float_dtype():
    c = LookaheadCache(recycle_k=2, background_indexing=False)
    c.start_request(1, [5, 6])
    ids = torch.tensor([[7, 8]])
    c.extend(1, [7], ids, torch.tensor([[0.5, 0.25]], dtype=torch.bfloat16))
    assert c.stats()["recycled_keys"] == 2
    with pytest.raises(InvalidInput, match="2-D"):
        c.extend(1, [7], ids, object())


def test_top_rows_of_bad_logits_are_dropped_not_raised():
    from lookahead.hf.recycling import top_rows

    logits = torch.full((2, 10), float("nan"))
    ids, p = top_rows(logits, 3)
    assert np.all(p == 0)
    c = LookaheadCache(recycle_k=3, background_indexing=False)
    c.start_request(1, [5, 6])
    c.extend(1, [7, 8], ids, p)  # all-zero rows: checked, nothing kept
    assert c.stats()["recycled_keys"] == 0


def test_top_rows_are_the_softmax_top_k():
    from lookahead.hf.recycling import top_rows

    logits = torch.randn(5, 40)
    ids, p = top_rows(logits, 3)
    ref = torch.softmax(logits, -1).topk(3)
    assert ids.dtype == np.uint32 and p.dtype == np.float32
    assert np.array_equal(ids, ref.indices.numpy())
    assert np.allclose(p, ref.values.numpy(), atol=1e-6)
    probs = torch.softmax(logits * 2, -1)
    ids, p = top_rows(logits, 3, probs)
    assert np.allclose(p, probs.topk(3).values.numpy())


@pytest.mark.parametrize("keep", [True, False])
def test_prefill_rows_are_those_of_one_forward(monkeypatch, keep):
    import lookahead.hf.recycling as recycling
    from lookahead.hf.kv import last_logits_only

    model = tiny_model("llama", seed=2)
    ids = [2 + (i * 37) % (VOCAB - 2) for i in range(150)]
    monkeypatch.setattr(recycling, "RECYCLE_PROMPT_ROWS", 100)  # rows of the last 100 only
    kw = last_logits_only(model) if keep else {}
    assert bool(kw) == keep
    with torch.inference_mode():
        ref = torch.softmax(model(input_ids=torch.tensor([ids])).logits[0], -1).topk(4)
        kv = new_cache(model)
        first, top_ids, top_p = recycling.prefill_with_rows(model, kv, ids, 4, kw)
    assert first == 50 and kv.get_seq_length() == len(ids)
    assert np.array_equal(top_ids, ref.indices[50:].numpy())
    assert np.allclose(top_p, ref.values[50:].numpy(), atol=1e-5)


def test_predictions_are_checked_by_shape_before_they_are_scanned():
    import numpy as np
    from lookahead import InvalidInput, LookaheadCache

    c = LookaheadCache(recycle_k=4, background_indexing=False)
    c.start_request(1, [1, 2, 3])
    rows = (10**9, 64)  # 64e9 entries: scanning them took 20-40 s, then a MemoryError
    ids = np.broadcast_to(np.uint32(5), rows)
    probs = np.broadcast_to(np.float32(0.5), rows)
    with pytest.raises(InvalidInput, match=r"one row per token \(1\), got 1000000000"):
        quickly(lambda: c.extend(1, [4], ids, probs), 2.0)
    wide = (1, 10**7)
    with pytest.raises(InvalidInput, match="1 <= k <= 4096"):
        quickly(
            lambda: c.recycle(
                1, [4], np.broadcast_to(np.uint32(5), wide), np.broadcast_to(np.float32(0.5), wide)
            ),
            2.0,
        )
    c.extend(1, [4], [[5, 6]], [[0.5, 0.25]])  # a good row is kept as before


@pytest.mark.parametrize("value", [1, 0, 1.0, "on", "yes"])
def test_recycle_takes_booleans_not_numbers(value):
    from lookahead.hf import LookaheadGenerator
    from tiny_models import tiny_model

    with pytest.raises(ValueError, match="recycle must be None, False, True or 'path'"):
        LookaheadGenerator(tiny_model("llama"), None, recycle=value)
