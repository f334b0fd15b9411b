"""The public API of `lookahead.LookaheadCache`: argument checks, errors, stats, save/load."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import lookahead
import numpy as np
import pytest
from bounded import quickly
from lookahead import (
    Draft,
    InvalidInput,
    LookaheadCache,
    LookaheadError,
    RequestExists,
    UnknownRequest,
    _core,
    errors,
)


@pytest.fixture
def cache():
    c = LookaheadCache(max_depth=4, capacity_nodes=100_000, background_indexing=False)
    c.start_request(1, [5, 6, 7, 5, 6, 8])
    return c


def test_every_core_error_maps_to_a_lookahead_exception():
    kinds = _core._error_kinds()
    assert {k for k, _ in kinds} == {
        "InvalidInput",
        "UnknownRequest",
        "RequestExists",
        "Io",
        "NotFound",
        "Format",
        "Invariant",
        "Internal",
    }
    builtin = {
        "InvalidInput": ValueError,
        "UnknownRequest": KeyError,
        "RequestExists": ValueError,
        "Io": OSError,
        "NotFound": FileNotFoundError,
        "Format": ValueError,
        "Invariant": RuntimeError,
        "Internal": RuntimeError,
    }
    for kind, name in kinds:
        cls = getattr(errors, name)
        with pytest.raises(cls, match="^msg ä$") as info:
            _core._raise_error(kind, "msg ä")
        assert isinstance(info.value, LookaheadError)
        assert isinstance(info.value, builtin[kind])


def test_a_panic_becomes_an_internal_error():
    with pytest.raises(errors.InternalError, match="deliberate test panic"):
        _core._panic_for_test()


@pytest.mark.parametrize(
    "bad, match",
    [
        ([1, -1], ">= 0"),
        ([2**32], "2\\*\\*32"),
        (np.array([2**32], dtype=np.int64), "< 2\\*\\*32"),
        (np.array([-3], dtype=np.int32), ">= 0"),
        ([1.5], "integers"),
        (np.array([1.0, 2.0]), "integers"),
        ([True, 2], "bool"),
        (np.array([True]), "integers"),
        (np.zeros((2, 2), dtype=np.int64), "1-D"),
        (np.int64(3), "1-D"),
        ("abc", "sequence"),
        ([1, "a"], "integers"),
        ([2**70], "2\\*\\*32"),
        (5, "sequence"),
        ([[1, 2]], "1-D"),
        (np.array([1, None], dtype=object), "integers"),
        (np.array(["7"]), "integers"),
        (np.array([2**32], dtype=np.uint64), "< 2\\*\\*32"),
        (np.array([-1], dtype=np.int8)[::-1], ">= 0"),
    ],
)
def test_bad_token_ids_raise_invalid_input(cache, bad, match):
    with pytest.raises(InvalidInput, match=match):
        cache.extend(1, bad)
    with pytest.raises(InvalidInput, match=match):
        cache.step(1, bad)
    with pytest.raises(InvalidInput):
        cache.start_request(2, bad)
    with pytest.raises(InvalidInput):
        cache.add_history([bad])


def test_bad_arguments(cache):
    with pytest.raises(InvalidInput, match="at least one token"):
        cache.start_request(2, [])
    for budget in (0, -1, True, 1.5, _core.MAX_BUDGET + 1):
        with pytest.raises(InvalidInput, match="budget"):
            cache.draft(1, budget=budget)
        with pytest.raises(InvalidInput, match="budget"):
            cache.draft_batch([1], budget=budget)
    for rid in (None, 1.0, True, (1,), 2**64):
        with pytest.raises(InvalidInput, match="request id"):
            cache.draft(rid)
    with pytest.raises(InvalidInput, match="namespace"):
        cache.start_request(3, [1], namespace=1)
    with pytest.raises(InvalidInput, match="keep_prompt"):
        cache.finish_request(1, keep_prompt=1)
    cache.start_request(5, [1, 2])
    cache.finish_request(5, keep_prompt=np.bool_(False))  # as `load` takes numpy bools
    for kw in (
        {"max_depth": 1},
        {"max_depth": 65},
        {"capacity_nodes": 0},
        {"own_weight": -1.0},
        {"own_weight": 0.0, "history_weight": 0.0},
        {"history_weight": float("nan")},
        {"own_weight": 1e308, "history_weight": 1e308},  # scores would overflow
        {"max_depth": 2.5},
        {"capacity_nodes": 2**70},
        {"index_threads": 257},
        {"index_threads": 10**5},  # refused before any thread starts
        {"history_skip": (0, 3)},
        {"history_skip": (4, 3)},
        {"history_skip": (1, 65)},
        {"history_skip": (3,)},
        {"history_skip": "36"},
        {"history_skip": (3.0, 6)},
        {"history_skip": (True, 6)},
        {"keep_prompt_as_history": "false"},  # bool("false") is True
        {"background_indexing": "no"},
        {"background_indexing": None},
    ):
        with pytest.raises(InvalidInput):
            LookaheadCache(**kw)
    flags = LookaheadCache(keep_prompt_as_history=np.bool_(True), background_indexing=False)
    assert flags.config["keep_prompt_as_history"] is True
    for flag in (None, 1, "yes"):
        with pytest.raises(InvalidInput, match="multi_branch must be a bool"):
            cache.draft(1, multi_branch=flag)
        with pytest.raises(InvalidInput, match="multi_branch must be a bool"):
            cache.draft_batch([1], multi_branch=flag)
    assert cache.draft(1, multi_branch=np.bool_(False)).num_nodes >= 1
    # A str is iterable: drafting for its characters' requests would be silently wrong.
    for rids in ("ab", b"ab", 1):
        with pytest.raises(InvalidInput, match="sequence of request ids"):
            cache.draft_batch(rids)
    for threads in (-1, 1.5, True):
        with pytest.raises(InvalidInput, match="threads"):
            cache.draft_batch([1], threads=threads)
    with pytest.raises(InvalidInput, match="namespace names are at most"):
        cache.start_request(4, [1], namespace="x" * (2**20 + 1))
    with pytest.raises(InvalidInput, match="namespace names are at most"):
        cache.add_history([[1, 2]], namespace="x" * (2**20 + 1))
    many = [1] * ((1 << 28) // (_core.MAX_BUDGET + 1) + 1)
    with pytest.raises(InvalidInput, match="draft entries"):  # refused, not an abort on memory
        cache.draft_batch(many, budget=_core.MAX_BUDGET)
    with pytest.raises(InvalidInput, match="iters"):
        cache._c._time_drafts([1], 4, True, 2**40)  # refused before allocating its results


def test_bad_arguments_change_nothing(cache):
    before = cache.draft(1, budget=4)
    for call in (
        lambda: cache.step(1, [5], budget=0),
        lambda: cache.step(1, [5, -1]),
        lambda: cache.step(True, [5]),
        lambda: cache.extend(1, [5, 2**40]),
    ):
        with pytest.raises(InvalidInput):
            call()
    after = cache.draft(1, budget=4)
    assert after.tokens.tolist() == before.tokens.tolist()


def test_numpy_integer_ids_and_budgets(cache):
    d = cache.draft(np.int64(1), budget=np.int32(3), multi_branch=np.bool_(False))
    assert d.num_nodes == cache.draft(1, budget=3, multi_branch=False).num_nodes
    cache.extend(np.uint8(1), [np.int64(5), np.uint16(6)])
    cache.finish_request(np.int16(1))
    with pytest.raises(UnknownRequest):
        cache.draft(1)


def test_unknown_and_reused_request_ids(cache):
    with pytest.raises(RequestExists, match="already live"):
        cache.start_request(1, [1])
    with pytest.raises(UnknownRequest, match="not live"):
        cache.extend(9, [1])
    with pytest.raises(UnknownRequest):
        cache.draft("nope")
    with pytest.raises(UnknownRequest):
        cache.draft_batch([1, 9])
    cache.finish_request(1)
    for call in (
        lambda: cache.draft(1),
        lambda: cache.extend(1, [1]),
        lambda: cache.finish_request(1),
    ):
        with pytest.raises(UnknownRequest):
            call()
    # A finished id may start a new request; an int and a str id never collide.
    cache.start_request(1, [3])
    cache.start_request("1", [3])
    assert cache.stats()["live_requests"] == 2


def test_inputs_lists_numpy_and_zero_copy(cache):
    cache.extend(1, np.array([5, 6], dtype=np.int16))
    cache.extend(1, np.array([7], dtype=np.uint64))
    cache.extend(1, (5,))
    cache.extend(1, np.arange(10, dtype=np.int64)[::3])  # non-contiguous
    cache.extend_ndarray(1, np.array([5, 6], dtype=np.uint32))
    cache.extend(1, [])
    d = cache.draft(1, budget=3, multi_branch=False)
    assert (
        d.tokens.dtype == np.int32 and d.parents.dtype == np.int32 and d.scores.dtype == np.float32
    )
    assert d.tokens[0] == 6 and d.parents[0] == -1 and d.scores[0] == 1.0
    assert d.num_nodes == len(d.tokens) >= 2
    cache.check_invariants()


@pytest.mark.parametrize(
    "dtype",
    [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64, ">i4"],
)
def test_extend_ndarray_takes_any_integer_dtype(dtype):
    def cache_after(extend):
        c = LookaheadCache(max_depth=4, background_indexing=False)
        c.start_request(1, np.array([5, 6, 7, 5, 6, 8], dtype=dtype))
        extend(c)
        return c.draft(1, budget=4)

    want = cache_after(lambda c: c.extend(1, [5, 6, 7]))
    arrays = (
        np.array([5, 6, 7], dtype=dtype),
        np.array([7, 0, 6, 0, 5], dtype=dtype)[::-2],  # strided, reversed
    )
    for arr in arrays:
        got = cache_after(lambda c, arr=arr: c.extend_ndarray(1, arr))
        assert got.tokens.tolist() == want.tokens.tolist()
        assert got.parents.tolist() == want.parents.tolist()
        assert got.scores.tolist() == want.scores.tolist()


def test_torch_tensors_are_token_ids(cache):
    torch = pytest.importorskip("torch")
    want = LookaheadCache(max_depth=4, background_indexing=False)
    want.start_request(1, [5, 6, 7, 5, 6, 8])
    want.extend(1, [5, 6])
    cache.extend(1, torch.tensor([5, 6]))
    assert cache.draft(1).tokens.tolist() == want.draft(1).tokens.tolist()
    cache.start_request(2, torch.tensor([1, 2, 3], dtype=torch.int32))

    class SelfTensor:  # looks like a tensor, and its .numpy() is itself: no recursion
        def detach(self):
            return self

        cpu = numpy = detach

    with pytest.raises(InvalidInput, match="not a numpy array"):
        cache.extend(1, SelfTensor())
    for bad, match in (
        (torch.tensor([True]), "integers"),
        (torch.tensor([1.0]), "integers"),
        (torch.tensor([-1]), ">= 0"),
        (torch.zeros(2, 2, dtype=torch.long), "1-D"),
    ):
        with pytest.raises(InvalidInput, match=match):
            cache.extend(1, bad)


def test_step_is_extend_then_draft():
    rng = np.random.default_rng(3)
    a = LookaheadCache(max_depth=5, background_indexing=False)
    b = LookaheadCache(max_depth=5, background_indexing=False)
    history = rng.integers(0, 20, size=300)
    for c in (a, b):
        c.add_history([history])
    prompt = rng.integers(0, 20, size=50)
    for rid in range(4):
        a.start_request(rid, prompt)
        b.start_request(rid, prompt)
    for i in range(200):
        rid, budget, multi = i % 4, int(rng.integers(1, 20)), bool(i % 3)
        new = rng.integers(0, 20, size=int(rng.integers(0, 5))).tolist()
        got = a.step(rid, new, budget=budget, multi_branch=multi)
        b.extend(rid, new)
        want = b.draft(rid, budget=budget, multi_branch=multi)
        assert got.num_nodes == want.num_nodes
        assert got.tokens.tolist() == want.tokens.tolist()
        assert got.parents.tolist() == want.parents.tolist()
        assert got.scores.tolist() == want.scores.tolist()
    assert a.stats() == b.stats()
    with pytest.raises(UnknownRequest):
        a.step(9, [1])


def test_a_bounded_draft_is_the_draft_without_foreign_ids_and_deep_nodes():
    from tiny_models import bounded

    rng = np.random.default_rng(5)
    a = LookaheadCache(max_depth=6, background_indexing=False)
    b = LookaheadCache(max_depth=6, background_indexing=False)
    # Ids up to 2**32 - 1 (the top bit set) mixed in: a history of another vocabulary.
    history = rng.choice([1, 2, 3, 4, 5, 2**31 + 7, 2**32 - 1], size=400)
    prompt = rng.choice([1, 2, 3, 4, 5, 2**32 - 1], size=60)
    for c in (a, b):
        c.add_history([history])
        c.start_request(0, prompt)
    seen = set()
    for i in range(300):
        budget, multi = int(rng.integers(1, 24)), bool(i % 3)
        vocab = [None, 1, 4, 6, 2**31 + 8, 2**32][i % 6]
        depth = [None, 0, 1, 2, 5][i % 5]
        new = rng.choice([1, 2, 3, 2**32 - 1], size=int(rng.integers(0, 4))).tolist()
        got = a.step(0, new, budget, multi, vocab=vocab, max_depth=depth)
        b.extend(0, new)
        full = b.draft(0, budget, multi)
        want = bounded(full, vocab, depth)
        for name in ("tokens", "parents", "scores", "matched"):
            assert getattr(got, name).tolist() == getattr(want, name).tolist(), name
        assert got.num_nodes == want.num_nodes
        same = b.draft(0, budget, multi, vocab=vocab, max_depth=depth)
        assert same.tokens.tolist() == got.tokens.tolist()
        seen.add(want.num_nodes < full.num_nodes)
    assert seen == {True, False}  # some drafts lost nodes, some none
    before = a.stats()
    for bad, match in [({"vocab": 0}, "vocab must be in"), ({"vocab": 2**32 + 1}, "vocab"),
                       ({"max_depth": -1}, "max_depth must be in"), ({"vocab": 1.5}, "an int"),
                       ({"max_depth": True}, "an int")]:  # fmt: skip
        with pytest.raises(InvalidInput, match=match):
            a.draft(0, 4, True, **bad)
        with pytest.raises(InvalidInput, match=match):
            a.step(0, [1], 4, True, **bad)  # refused before the tokens are added
    assert a.stats() == before


def test_draft_objects(cache):
    import copy
    import pickle

    d = cache.draft(1, budget=3)
    assert isinstance(d, Draft)
    with pytest.raises(AttributeError):
        d.num_nodes = 5
    for e in (pickle.loads(pickle.dumps(d)), copy.copy(d)):
        assert isinstance(e, Draft) and e.num_nodes == d.num_nodes
        assert e.tokens.tolist() == d.tokens.tolist() and e.scores.dtype == np.float32
        assert e.matched.tolist() == d.matched.tolist() and e.matched.dtype == np.uint8
    assert repr(d).startswith("Draft(tokens=array([8]") and "num_nodes=1, matched=" in repr(d)
    row = cache.draft_batch([1], budget=3).row(0)
    assert isinstance(row, Draft) and row.tokens.tolist() == d.tokens.tolist()
    # Built without `matched` (as before it existed): zeros.
    assert Draft(d.tokens, d.parents, d.scores, 1).matched.tolist() == [0]


def test_matched_counts_the_ngram_each_node_continues(cache):
    cache.extend(1, [5])
    # Context "5 6 7 5 6 8 5": "8 5" is unseen, "5" continues with 6 (a 1-token match);
    # then "5 6" continues with 7 and 8 (2 tokens).
    d = cache.draft(1, budget=4, multi_branch=True)
    assert d.matched.tolist()[:4] == [0, 1, 2, 2]
    b = cache.draft_batch([1], budget=4)
    assert b.matched.dtype == np.uint8 and b.matched[0].tolist() == d.matched.tolist()


def test_draft_follows_the_prompt_and_empty_draft(cache):
    d = cache.draft(1, budget=4, multi_branch=True)
    # Context "5 6 7 5 6 8": suffix "6 8" is unseen, "8" too -> nothing matched.
    assert d.num_nodes == 1 and d.tokens.tolist() == [8] and d.parents.tolist() == [-1]
    cache.extend(1, [5])
    d = cache.draft(1, budget=4, multi_branch=True)
    # After "8 5": prompt continues "5 6" (twice), then "6 7" / "6 8" (once each).
    assert d.tokens.tolist()[:2] == [5, 6]
    assert d.parents.tolist()[:2] == [-1, 0]
    assert set(d.tokens.tolist()[2:4]) == {7, 8}
    s = cache.stats()
    assert (s["hits"], s["misses"]) == (1, 1)


def test_namespaces_are_isolated():
    c = LookaheadCache(max_depth=3, background_indexing=False)
    c.add_history([[1, 2, 3, 4]], namespace="a")
    c.start_request("x", [9, 1], namespace="a")
    c.start_request("y", [9, 1], namespace="b")
    c.start_request("z", [9, 1])
    assert c.draft("x", budget=3).tokens.tolist() == [1, 2, 3, 4]
    assert c.draft("y", budget=3).num_nodes == 1
    assert c.draft("z", budget=3).num_nodes == 1
    c.extend("y", [2, 7])
    c.start_request("w", [1], namespace="b")
    assert c.draft("w", budget=1).tokens.tolist() == [1, 2]
    assert c.stats()["namespaces"] == 3


def test_a_requests_own_outputs_outrank_the_shared_history():
    c = LookaheadCache(max_depth=3, background_indexing=False)
    c.add_history([[1, 2, 3]] * 3)  # elsewhere, "1 2" was followed by 3, three times
    c.start_request("r", [9])
    c.extend("r", [1, 2, 4, 1, 2])  # this request said "1 2 4" once
    # Own trie (weight 4): 4 scores 1/2; history: 3 scores 3/6, 4 scores 1/6. Before the
    # request's outputs went into its own trie, 3 came first here.
    assert c.draft("r", budget=1, multi_branch=False).tokens.tolist() == [2, 4]
    # With the shared history weighed out, the request still drafts from its own outputs,
    # and no history is kept (nothing would read it), kept prompts included.
    c = LookaheadCache(
        max_depth=3, history_weight=0.0, background_indexing=False, keep_prompt_as_history=True
    )
    c.start_request("r", [9])
    c.extend("r", [1, 2, 4, 1, 2])
    assert c.draft("r", budget=1).tokens.tolist() == [2, 4]
    c.finish_request("r")
    assert c.stats()["nodes"] == 0
    # With the request's own text weighed out, no own trie is built (its nodes could not be
    # evicted and would push out the history that drafts do read).
    c = LookaheadCache(max_depth=3, own_weight=0.0, background_indexing=False)
    c.add_history([[1, 2, 4]])
    base = c.stats()["nodes"]
    c.start_request("r", list(range(100, 200)))
    c.extend("r", [1, 2])
    # Only the history's new n-grams ending at 1 and 2 ("199 1", "198 199 1", "199 1 2" and
    # their prefixes "199", "198", "198 199"): the 100-token prompt added no node.
    assert c.stats()["nodes"] == base + 6
    assert c.draft("r", budget=1).tokens.tolist() == [2, 4]


def test_keep_prompt_merges_into_history():
    c = LookaheadCache(max_depth=3, background_indexing=False)
    c.start_request(1, [4, 5, 6])
    c.finish_request(1, keep_prompt=True)
    c.start_request(2, [7, 3, 4])
    assert c.draft(2, budget=2, multi_branch=False).tokens.tolist() == [4, 5, 6]
    c.start_request(3, [8, 9, 1])
    c.finish_request(3)  # the constructor's default: dropped
    c.start_request(4, [8, 9])
    assert c.draft(4, budget=2).num_nodes == 1
    s = c.stats()
    assert s["nodes"] == s["history_nodes"] + s["own_nodes"] and s["live_requests"] == 2


def test_capacity_holds_and_eviction_counts():
    c = LookaheadCache(max_depth=6, capacity_nodes=2_000, background_indexing=True)
    rng = np.random.default_rng(1)
    for i in range(30):
        c.add_history([rng.integers(0, 50, size=200)])
        c.start_request(i, rng.integers(0, 50, size=300))
        c.extend(i, rng.integers(0, 50, size=40))
        c.draft(i, budget=8)
        s = c.stats()
        assert s["nodes"] <= 2_000, s
        c.check_invariants()
        if i % 3 == 0:
            c.finish_request(i, keep_prompt=bool(i % 2))
    s = c.stats()
    assert s["evicted_nodes"] > 0 and s["capacity_nodes"] == 2_000


def test_a_prompt_bigger_than_the_capacity_is_truncated():
    c = LookaheadCache(max_depth=12, capacity_nodes=1_000, background_indexing=False)
    c.start_request(1, np.arange(5_000) % 977)
    s = c.stats()
    # One prompt takes at most a quarter of the capacity (`PROMPT_SHARE`).
    assert s["own_nodes"] == 250 and s["truncated_prompts"] == 1
    c.check_invariants()
    c.finish_request(1)
    assert c.stats()["nodes"] == 0


def test_history_skip_leaves_short_history_matches_out():
    # Another request's text continues "10 11 12 13" (4 tokens) with 99; this request's prompt
    # continues only "12 13", with 50. By default the history sits out at 3-6 tokens: the
    # 2-token match wins, where the history says 99 too but the request's own text counts 4x.
    def first_token(**kw):
        c = LookaheadCache(background_indexing=False, **kw)
        c.add_history([[10, 11, 12, 13, 99]])
        c.start_request(1, [5, 12, 13, 50, 7, 10, 11, 12, 13])
        return c.draft(1, budget=1, multi_branch=False).tokens[1]

    assert first_token() == 50
    assert first_token(history_skip=(3, 6)) == 50
    assert first_token(history_skip=None) == 99
    assert first_token(history_skip=(5, 6)) == 99  # a 4-token match is not skipped
    # A long match (7+ tokens) is a repeat: the history answers again and is copied.
    c = LookaheadCache(background_indexing=False)
    c.add_history([list(range(1, 12))])
    c.start_request(1, [0, 1, 2, 3, 4, 5, 6, 7])
    assert c.draft(1, budget=3, multi_branch=False).tokens.tolist() == [7, 8, 9, 10]
    assert c.config["history_skip"] == (3, 6)
    assert LookaheadCache(history_skip=[2, 4]).config["history_skip"] == (2, 4)


def test_save_load_round_trip(tmp_path):
    c = LookaheadCache(
        max_depth=5,
        capacity_nodes=50_000,
        own_weight=0.5,
        background_indexing=False,
        history_skip=(2, 3),
        recycle_k=3,
        recycle_slots=500,
        recycle_weight=0.25,
    )
    rng = np.random.default_rng(2)
    c.add_history([rng.integers(0, 30, size=500) for _ in range(3)])
    c.add_history([[1, 2, 3, 1, 2, 4]], namespace="t")
    c.start_request(1, [9, 9])
    c.extend(1, [1, 2, 3])
    path = tmp_path / "cache.lkh"
    c.save(path)
    d = LookaheadCache.load(path)
    d.check_invariants()
    assert d.config == c.config  # the recycle settings too
    s, t = c.stats(), d.stats()
    assert t["history_nodes"] == s["history_nodes"] and t["live_requests"] == 0
    for ctx in ([1, 2], [7, 1], list(rng.integers(0, 30, size=4))):
        c.start_request("q", ctx)
        d.start_request("q", ctx)
        a, b = c.draft("q", budget=8), d.draft("q", budget=8)
        assert a.tokens.tolist() == b.tokens.tolist() and a.parents.tolist() == b.parents.tolist()
        c.finish_request("q")
        d.finish_request("q")
    (tmp_path / "junk").write_bytes(b"not a save file at all")
    with pytest.raises(errors.FileFormatError):
        LookaheadCache.load(tmp_path / "junk")
    with pytest.raises(errors.FileFormatError, match="junk"):
        LookaheadCache.load(tmp_path / "junk")
    # A missing file is a PersistError and a FileNotFoundError, naming the path and errno.
    with pytest.raises(FileNotFoundError, match=r"missing.*os error 2") as e:
        LookaheadCache.load(tmp_path / "missing")
    assert isinstance(e.value, errors.PersistError)
    with pytest.raises(errors.PersistError, match="is a directory"):
        LookaheadCache.load(tmp_path)
    with pytest.raises(errors.PersistError, match="no-such-dir"):
        c.save(tmp_path / "no-such-dir" / "x")
    with pytest.raises(InvalidInput, match="background_indexing"):
        LookaheadCache.load(path, background_indexing="no")
    assert (
        LookaheadCache.load(path, background_indexing=np.bool_(False)).config["background_indexing"]
        is False
    )
    # index_threads belongs to the machine: not saved, given at load (default 0: automatic).
    assert LookaheadCache.load(path).config["index_threads"] == 0
    assert LookaheadCache.load(path, index_threads=2).config["index_threads"] == 2
    for bad in (-1, 1.5, True, 257):
        with pytest.raises(InvalidInput, match="index_threads"):
            LookaheadCache.load(path, index_threads=bad)


def test_package_exports():
    for name in ("LookaheadCache", "Draft", "BatchDraft", "LookaheadError", "InvalidInput"):
        assert name in lookahead.__all__
    # Every exception the package raises can be caught by name from the package.
    for name in lookahead.errors.__all__:
        assert name in lookahead.__all__ and getattr(lookahead, name)
    assert issubclass(UnknownRequest, KeyError) and issubclass(RequestExists, ValueError)
    assert str(UnknownRequest("request 3 is not live")) == "request 3 is not live"
    # Submodules answer after a bare `import lookahead` (a fresh interpreter: here the tests
    # have imported them already), and `import lookahead` alone imports no torch.
    code = (
        "import sys, lookahead; assert 'torch' not in sys.modules; "
        "print(lookahead.models.load_model.__module__, lookahead.hf.sampling.__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["lookahead.models", "lookahead.hf.sampling"]
    with pytest.raises(AttributeError):
        lookahead.nope  # noqa: B018
    with pytest.raises(ImportError, match="lookahead.engine is now lookahead.hf"):
        importlib.import_module("lookahead.engine")
    with pytest.raises(
        AttributeError, match="lookahead.sampling moved: it is now lookahead.hf.sampling"
    ):
        lookahead.sampling  # noqa: B018


def test_draft_batch_pads_to_a_fixed_width():
    c = LookaheadCache(max_depth=4, background_indexing=False)
    c.start_request("a", [1, 2, 3, 1, 2, 3, 1, 2])
    c.start_request("b", [7, 8])  # nothing to draft: the root alone
    plain = c.draft_batch(["a", "b"], budget=3)
    tokens, parents, scores, num, matched = plain  # a named tuple
    assert tokens.shape == matched.shape == (2, 4) and num.tolist() == [4, 1]
    assert matched[1].tolist() == [0, 0, 0, 0] and matched[0, 1:].min() > 0
    assert parents[1].tolist() == [-1, -1, -1, -1] and tokens[1, 1:].tolist() == [0, 0, 0]
    wide = c.draft_batch(["a", "b"], budget=3, width=7, pad_parent=0)
    assert wide.tokens.shape == wide.parents.shape == wide.scores.shape == (2, 7)
    assert wide.matched.shape == (2, 7) and wide.matched[:, 4:].max() == 0
    np.testing.assert_array_equal(wide.tokens[:, :4], plain.tokens)
    np.testing.assert_array_equal(wide.parents[0, :4], plain.parents[0])
    # NGRAM's padding: token-0 children of the root; the root keeps parent -1.
    assert wide.parents[1].tolist() == [-1, 0, 0, 0, 0, 0, 0]
    assert wide.parents[0, 4:].tolist() == [0, 0, 0] and wide.tokens[0, 4:].tolist() == [0, 0, 0]
    assert wide.row(0).tokens.tolist() == plain.row(0).tokens.tolist()
    for kw, match in (
        ({"width": 3}, "width must be in"),
        ({"width": 0}, "width must be a positive int"),
        ({"width": 4.0}, "width must be a positive int"),
        ({"pad_parent": 1}, "pad_parent must be -1 or 0"),
        ({"pad_parent": True}, "pad_parent must be -1 or 0"),
    ):
        with pytest.raises(InvalidInput, match=match):
            c.draft_batch(["a"], budget=3, **kw)


def test_extend_batch_is_extend_per_request():
    kw = dict(max_depth=4, background_indexing=False)
    one, many = LookaheadCache(**kw), LookaheadCache(**kw)
    prompts = {"a": [1, 2, 3, 4], "b": [5, 6, 7], 3: [1, 9]}
    news = {"a": [2, 3, 1], "b": [], 3: [9, 1, 2, 3]}
    for c in (one, many):
        for rid, p in prompts.items():
            c.start_request(rid, p)
    for rid, new in news.items():
        one.extend(rid, new)
    flat = np.array([t for new in news.values() for t in new], dtype=np.int64)
    many.extend_batch(list(news), flat, [len(n) for n in news.values()])
    for rid in prompts:
        a, b = one.draft(rid, budget=6), many.draft(rid, budget=6)
        assert a.tokens.tolist() == b.tokens.tolist() and a.parents.tolist() == b.parents.tolist()
    # Checked before anything changes: an unknown id, lengths that do not add up.
    before = many.stats()
    with pytest.raises(UnknownRequest):
        many.extend_batch(["a", "nope"], [1, 2], [1, 1])
    for rids, lengths, match in (
        (["a"], [1], "lengths add up to 1, not to the 2 tokens"),
        (["a"], [1, 1], "1 request ids but 2 lengths"),
        (["a", "b"], [-1, 3], "non-negative"),
        (["a", "b"], [1.0, 1], "non-negative"),
        ("ab", [1, 1], "sequence of request ids"),
    ):
        with pytest.raises(InvalidInput, match=match):
            many.extend_batch(rids, [1, 2], lengths)
    assert many.stats() == before


def test_huge_or_lying_lengths_are_refused_not_aborted():
    """`len()` is never trusted for an allocation: `range(2**40)` once aborted the
    interpreter reserving 4 TiB; now every method refuses it in one line, at once."""
    import collections.abc

    import lookahead
    from lookahead import _core

    c = lookahead.LookaheadCache(max_depth=8, capacity_nodes=10_000)
    c.start_request("r", [1, 2, 3])

    class Claims(collections.abc.Sequence):
        """A sequence whose `len()` says `n` while it holds `items`."""

        def __init__(self, n, items):
            self.n, self.items = n, items

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            return self.items[i]

    huge = [range(2**40), range(_core.MAX_IDS_PER_CALL + 1), Claims(2**62, [1, 2])]
    calls = (
        lambda ids: c.extend("r", ids),
        lambda ids: c.step("r", ids, budget=4),
        lambda ids: c.start_request("r2", ids),
        lambda ids: c.add_history([ids]),
        lambda ids: c.extend_batch(["r"], ids, [3]),
    )
    for ids in huge:
        for call in calls:
            with pytest.raises(lookahead.InvalidInput, match="token ids in one call"):
                call(ids)
    # A short `len()` is only a hint: every item given is read.
    c.extend("r", Claims(1, [4, 5, 6, 7]))
    c.extend("r", range(5))
    assert c.stats()["live_requests"] == 1


def test_hostile_arguments_raise_the_packages_own_errors():
    import torch

    c = LookaheadCache(background_indexing=False)
    # Each of these once raised a built-in exception (or was silently accepted).
    for bad_rid in ("r\udcff",):
        with pytest.raises(InvalidInput, match="lone surrogate"):
            c.start_request(bad_rid, [1, 2])
    with pytest.raises(InvalidInput, match="lone surrogate"):
        c.start_request(1, [1, 2], namespace="ns\ud800")
    with pytest.raises(InvalidInput, match="tensor of torch.bfloat16"):
        c.start_request(2, torch.tensor([1, 2], dtype=torch.bfloat16))
    with pytest.raises(InvalidInput, match="tensor of torch.float32"):
        c.start_request(2, torch.tensor([1.0, 2.0]))
    for not_ids in (bytearray(b"\x01\x02"), memoryview(b"\x01\x02"), b"\x01"):
        with pytest.raises(InvalidInput, match="sequence of ints"):
            c.start_request(3, not_ids)
    masked = np.ma.masked_array([1, 2, 3], mask=[0, 1, 0])
    with pytest.raises(InvalidInput, match="mask would be ignored"):
        c.start_request(4, masked)
    for corpus in (None, 5, "abc"):
        with pytest.raises(InvalidInput, match="corpus must be a list"):
            c.add_history(corpus)
    c.start_request(5, [1, 2, 3])
    for pad in (0.0, -1.0, True, "0"):
        with pytest.raises(InvalidInput, match="pad_parent"):
            c.draft_batch([5], budget=4, pad_parent=pad)
    assert c.draft_batch([5], budget=4, pad_parent=np.int64(0)).parents.shape == (1, 5)
    assert c.stats()["live_requests"] == 1
    c.check_invariants()


def test_ctrl_c_stops_a_long_add_history_within_a_second():
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        import os, signal, threading, time
        import numpy as np
        from lookahead import LookaheadCache
        # Python's own Ctrl-C handler, even where this process was started with SIGINT
        # ignored (a background job of a shell without job control inherits that)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        c = LookaheadCache(capacity_nodes=50_000_000, background_indexing=False)
        text = np.random.default_rng(0).integers(0, 32000, size=20_000_000)
        sent = []
        def interrupt():
            sent.append(time.perf_counter())
            os.kill(os.getpid(), signal.SIGINT)
        threading.Timer(1.0, interrupt).start()
        t0 = time.perf_counter()
        try:
            c.add_history([text])
            print("finished", time.perf_counter() - t0)
        except KeyboardInterrupt:
            print("interrupted", time.perf_counter() - sent[0])
        c.check_invariants()
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    word, seconds = out.stdout.split()
    assert word == "interrupted", out.stdout
    assert float(seconds) < 1.0, out.stdout


def test_renamed_knobs_are_refused_with_their_new_names():
    with pytest.raises(InvalidInput, match="prompt_weight is now own_weight"):
        LookaheadCache(prompt_weight=2.0)
    with pytest.raises(InvalidInput, match="output_weight is now history_weight"):
        LookaheadCache(output_weight=2.0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'nope'"):
        LookaheadCache(nope=1)


def test_defaults_have_one_source():
    # The core's Config::default() is what the wrapper, the CLI, the SGLang plugin and the
    # README's knob table say.
    from lookahead import cli
    from lookahead.hf import DEFAULT_DEPTH
    from lookahead.sglang.config import EXTRA_KEYS

    defaults = lookahead._core.DEFAULTS
    params = inspect.signature(LookaheadCache.__init__).parameters
    assert {k: params[k].default for k in defaults} == defaults
    assert LookaheadCache(background_indexing=False).config == defaults | {
        "background_indexing": False
    }
    assert DEFAULT_DEPTH == defaults["max_depth"]
    assert cli.build_parser().parse_args(["demo"]).depth == defaults["max_depth"]
    for key in ("own_weight", "history_weight", "keep_prompt_as_history"):
        assert EXTRA_KEYS[key] == defaults[key]
    assert tuple(EXTRA_KEYS["history_skip"]) == defaults["history_skip"]
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    rows = {}
    for line in readme.splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) == 4 and cells[1] == "`LookaheadCache`":
            for knob, value in zip(cells[0].split(" / "), cells[2].split(" / ")):
                rows[knob.strip("`")] = value
    shown = {
        "own_weight": "4.0",
        "history_weight": "1.0",
        "history_skip": "(3, 6)",
        "recycle_k": "0",
        "recycle_slots": "2**18",
        "recycle_weight": "0.5",
        "capacity_nodes": "4,000,000",
        "keep_prompt_as_history": "False",
        "background_indexing": "True",
    }
    for knob, text in shown.items():
        assert rows[knob] == text, knob
        written = eval(text.replace(",", "") if knob == "capacity_nodes" else text)
        assert written == defaults[knob], knob


def test_every_exception_is_a_lookahead_error():
    import ast

    for name in lookahead.errors.__all__:
        assert issubclass(getattr(lookahead, name), LookaheadError), name
    # No module defines an exception of its own outside lookahead/errors.py.
    package = Path(lookahead.__file__).resolve().parent
    for path in package.rglob("*.py"):
        if path.name == "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b) for b in node.bases]
                assert not any(b.endswith(("Error", "Exception")) for b in bases), (path, node.name)


def test_unchecked_legacy_saves_load_only_when_allowed(tmp_path, fifo):
    import struct

    from lookahead import FileFormatError, InvalidInput, LookaheadCache

    # A version 1 file (no checksum): depth 6, capacity 1000, weights 4 / 1, no namespace.
    v1 = b"LKAHTRIE" + struct.pack("<IIQdd", 1, 6, 1000, 4.0, 1.0) + b"\0\0" + b"\0" * 4 + b"END!"
    path = tmp_path / "old.bin"
    path.write_bytes(v1)
    with pytest.raises(FileFormatError, match="version 1 save file, which has no checksum"):
        LookaheadCache.load(path)
    old = LookaheadCache.load(path, allow_legacy=True)
    assert old.config["max_depth"] == 6
    old.save(tmp_path / "new.bin")  # saved again, it is a checked file
    assert LookaheadCache.load(tmp_path / "new.bin").config["max_depth"] == 6
    with pytest.raises(InvalidInput, match="allow_legacy must be a bool"):
        LookaheadCache.load(path, allow_legacy=1)
    for special in (fifo, "/dev/zero"):
        with pytest.raises(Exception, match="not a regular file"):
            quickly(lambda p=special: LookaheadCache.load(p))
    with pytest.raises(InvalidInput, match="not a regular file"):
        old.save(fifo)
    assert fifo.exists() and not fifo.is_file()
