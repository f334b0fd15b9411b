"""The plugin's corpus and warm-restart pieces without a server: SGLang's chunk format,
scopes, the worker's corpus calls, and what a load refuses."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from lookahead.errors import LookaheadConfigError
from lookahead.sglang.config import ServingConfig
from lookahead.sglang.corpora import SEPARATOR_TOKEN, CorpusBook, documents_of
from lookahead.sglang.drafter import LookaheadDrafter
from lookahead.sglang.warm import Saver, fingerprint, load_cache


def config(**extra) -> ServingConfig:
    args = SimpleNamespace(
        speculative_num_draft_tokens=8,
        speculative_ngram_max_trie_depth=8,
        speculative_ngram_capacity=100_000,
        speculative_ngram_max_bfs_breadth=1,
        speculative_ngram_external_corpus_path=None,
        speculative_ngram_external_corpus_max_tokens=1000,
    )
    return ServingConfig.from_args(args, json.dumps({"background_indexing": False, **extra}))


def test_sglang_chunks_become_whole_documents():
    chunks = [[1, 2], [3], [SEPARATOR_TOKEN, 4, 5], [6, SEPARATOR_TOKEN], [SEPARATOR_TOKEN, 7]]
    assert documents_of(chunks) == [[1, 2, 3], [4, 5, 6], [7]]
    assert documents_of([]) == []


def test_the_worker_book_adds_lists_removes_and_scopes():
    drafter = LookaheadDrafter(config(corpus_scope="by_id"))
    book = CorpusBook(drafter, drafter.config.corpora)
    assert book.add("acme/manual", [[50, 51, 52], [53, SEPARATOR_TOKEN, 60, 61]]) == 6
    assert book.listing() == {"acme/manual": 6}
    (info,) = drafter.cache.corpora()
    assert info["scope"] == drafter.namespace_of_key("acme")
    with pytest.raises(ValueError, match="EXTRA_KEY/NAME"):
        book.add("manual", [[1, 2]])
    book.remove("acme/manual")
    with pytest.raises(ValueError, match="no corpus 'acme/manual' is loaded"):
        book.remove("acme/manual")
    everyone = LookaheadDrafter(config())
    CorpusBook(everyone, everyone.config.corpora).add("manual", [[1, 2, 3]])
    assert everyone.cache.corpora()[0]["scope"] is None


def test_a_reset_keeps_the_corpora():
    drafter = LookaheadDrafter(config())
    CorpusBook(drafter, drafter.config.corpora).add("manual", [[1, 2, 3]])
    drafter.reset()
    assert [c["id"] for c in drafter.cache.corpora()] == ["manual"]


class Tok:
    def __init__(self, vocab):
        self.vocab = vocab

    def get_vocab(self):
        return dict(self.vocab)


def test_a_load_refuses_another_tokenizer_or_other_settings(tmp_path):
    meta = fingerprint(Tok({"a": 0, "b": 1}), 2)
    drafter = LookaheadDrafter(config())
    drafter.cache.add_history([[1, 2, 3, 1, 2]])
    path = tmp_path / "trie.bin"
    saver = Saver(str(path), 0, meta)
    assert saver.save(drafter.cache, "test") and saver.saves == 1
    fresh = LookaheadDrafter(config()).cache
    loaded = load_cache(str(path), False, fresh, meta)
    assert loaded.stats()["history_nodes"] == drafter.cache.stats()["history_nodes"]
    with pytest.raises(LookaheadConfigError, match="another tokenizer or vocabulary"):
        load_cache(str(path), False, fresh, fingerprint(Tok({"a": 0, "c": 1}), 2))
    deeper = LookaheadDrafter(config(own_weight=2.0)).cache
    with pytest.raises(LookaheadConfigError, match=r"other trie settings: own_weight=4.0"):
        load_cache(str(path), False, deeper, meta)
    assert load_cache(str(tmp_path / "none.bin"), True, fresh, meta) is None
    with pytest.raises(LookaheadConfigError, match="LOOKAHEAD_CONFIG load: "):
        load_cache(str(tmp_path / "none.bin"), False, fresh, meta)
    drafter.cache.save(path)  # no meta: not a server's file
    with pytest.raises(LookaheadConfigError, match="not saved by a LOOKAHEAD server"):
        load_cache(str(path), False, fresh, meta)


def test_a_failed_save_is_logged_and_serving_goes_on(tmp_path, caplog):
    drafter = LookaheadDrafter(config())
    saver = Saver(str(tmp_path / "gone" / "trie.bin"), 0, {"format": "x"})
    assert not saver.save(drafter.cache, "test")
    assert saver.failures == 1 and "save (test)" in caplog.text
