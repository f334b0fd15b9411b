"""Corpora through `LookaheadCache`: drafted from, scoped, removed, cut, saved, moved."""

from __future__ import annotations

import pytest
from lookahead import InvalidInput, LookaheadCache

MANUAL = [50, 51, 52, 53, 54, 55, 56]


def drafted(cache: LookaheadCache, rid: int, prompt: list[int], namespace: str = "default"):
    cache.start_request(rid, prompt, namespace)
    d = cache.draft(rid, 4, multi_branch=False)
    cache.finish_request(rid)
    return d.tokens[1:].tolist()


def test_a_corpus_is_drafted_from_then_removed_whole():
    c = LookaheadCache(max_depth=6, background_indexing=False)
    assert drafted(c, 1, [9, 50, 51]) == []
    info = c.add_corpus("manual", [MANUAL])
    assert info["id"] == "manual" and info["tokens"] == len(MANUAL) and not info["cut"]
    assert info["scope"] is None and info["nodes"] > 0 and info["bytes"] > 0
    assert drafted(c, 2, [9, 50, 51]) == [52, 53, 54, 55]
    assert c.stats()["corpora"] == 1 and c.stats()["corpus_nodes"] == info["nodes"]
    assert c.corpora() == [info]
    assert c.remove_corpus("manual") and not c.remove_corpus("manual")
    assert drafted(c, 3, [9, 50, 51]) == []
    assert c.stats()["corpus_nodes"] == 0
    c.check_invariants()


def test_a_scoped_corpus_serves_its_namespace_alone():
    c = LookaheadCache(max_depth=6, background_indexing=False)
    c.add_corpus("a/manual", [MANUAL], namespace="a")
    assert drafted(c, 1, [9, 50, 51], "a") == [52, 53, 54, 55]
    assert drafted(c, 2, [9, 50, 51], "b") == []


def test_bad_corpora_are_refused_with_a_clear_error():
    c = LookaheadCache(max_depth=6, background_indexing=False)
    c.add_corpus("x", [MANUAL])
    with pytest.raises(InvalidInput, match="exists"):
        c.add_corpus("x", [MANUAL])
    with pytest.raises(InvalidInput, match="corpus id"):
        c.add_corpus("", [MANUAL])
    with pytest.raises(InvalidInput, match="corpus_id must be a str"):
        c.add_corpus(3, [MANUAL])
    with pytest.raises(InvalidInput, match="documents must be a list"):
        c.add_corpus("y", "some text")
    with pytest.raises(InvalidInput, match=r"documents\[1\]"):
        c.add_corpus("y", [MANUAL, [1, -2]])
    with pytest.raises(InvalidInput, match="corpus_weight"):
        LookaheadCache(corpus_weight=0.0)
    assert [x["id"] for x in c.corpora()] == ["x"]  # nothing half-loaded
    c.check_invariants()


def test_a_corpus_past_its_share_is_cut_and_says_so():
    cap = 4_000
    c = LookaheadCache(max_depth=6, capacity_nodes=cap, background_indexing=False)
    doc = [(i * 7919) % 5003 for i in range(20_000)]
    info = c.add_corpus("big", [doc])
    assert info["cut"] and 0 < info["tokens"] < len(doc)
    assert info["nodes"] <= cap // 2
    assert c.stats()["nodes"] <= cap
    c.check_invariants()


def test_corpora_and_meta_survive_save_and_load(tmp_path):
    c = LookaheadCache(max_depth=6, background_indexing=False, corpus_weight=3.0)
    c.add_corpus("manual", [MANUAL], namespace="a")
    path = tmp_path / "warm.bin"
    c.save(path, meta='{"tokenizer": "abc"}')
    d = LookaheadCache.load(path)
    assert d.saved_meta == '{"tokenizer": "abc"}'
    assert d.corpora() == c.corpora() and d.config["corpus_weight"] == 3.0
    assert drafted(d, 1, [9, 50, 51], "a") == [52, 53, 54, 55]
    assert LookaheadCache().saved_meta is None
    with pytest.raises(InvalidInput, match="meta must be a str"):
        c.save(path, meta=b"x")


def test_corpora_move_to_a_replacing_cache():
    c = LookaheadCache(max_depth=6, background_indexing=False)
    c.add_corpus("manual", [MANUAL])
    fresh = LookaheadCache(max_depth=6, background_indexing=False)
    assert c.move_corpora_to(fresh) == ["manual"]
    assert c.corpora() == [] and drafted(fresh, 1, [9, 50, 51]) == [52, 53, 54, 55]
    fresh.check_invariants()
    c.check_invariants()
