"""`lookahead corpus build`: a file a server loads, bad lines and limits refused in one line."""

from __future__ import annotations

import json

import pytest
from lookahead.cli import main
from lookahead.sglang.config import ServingConfig
from lookahead.sglang.drafter import LookaheadDrafter
from lookahead.sglang.warm import fingerprint, load_cache
from tiny_models import tiny_config, tiny_tokenizer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    tiny_tokenizer().save_pretrained(path)
    tiny_config("llama").save_pretrained(path)
    return path


def server_cache(depth=18, capacity=10_000_000):
    from types import SimpleNamespace

    flags = SimpleNamespace(
        speculative_num_draft_tokens=8,
        speculative_ngram_max_trie_depth=depth,
        speculative_ngram_capacity=capacity,
        speculative_ngram_max_bfs_breadth=10,
    )
    return LookaheadDrafter(ServingConfig.from_args(flags, None)).cache


def test_a_built_corpus_loads_as_a_server_would_load_it(model_dir, tmp_path, capsys):
    docs = tmp_path / "manual.jsonl"
    docs.write_text(json.dumps("the quick brown fox") + "\n\n" + json.dumps("jumps over") + "\n")
    notes = tmp_path / "notes.txt"
    notes.write_text("a plain text document")
    out = tmp_path / "corpus.bin"
    rc = main(["corpus", "build", str(docs), str(notes), "--model", str(model_dir), "-o", str(out)])
    assert rc == 0
    said = capsys.readouterr().out
    assert "3 documents" in said and '{"load": ' in said
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    meta = fingerprint(tok, tiny_config("llama").vocab_size)
    cache = load_cache(str(out), False, server_cache(), meta)
    (info,) = cache.corpora()
    assert info["id"] == "corpus.bin" and info["scope"] is None and not info["cut"]
    assert info["tokens"] == len("the quick brown fox") + len("jumps over") + 21
    # Built for another depth: the server refuses it.
    from lookahead.errors import LookaheadConfigError

    with pytest.raises(LookaheadConfigError, match="max_depth=18"):
        load_cache(str(out), False, server_cache(depth=12), meta)


def test_bad_inputs_fail_in_one_line(model_dir, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps("fine") + "\n" + json.dumps({"text": "no"}) + "\n")
    out = tmp_path / "x.bin"
    base = ["corpus", "build", "--model", str(model_dir), "-o", str(out)]
    assert main(base + [str(bad)]) == 1
    assert (
        f"{bad}: Invalid external ngram corpus record at line 2: expected a JSON string."
        in capsys.readouterr().err
    )
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps("x" * 50) + "\n")
    assert main(base + [str(good), "--max-tokens", "10"]) == 1
    assert "passes --max-tokens 10 after 0 tokens" in capsys.readouterr().err
    assert main(base + [str(tmp_path / "missing.txt")]) == 1
    assert "no such file" in capsys.readouterr().err
    assert main(base + [str(good), "--lookahead-config", '{"bogus": 1}']) == 1
    assert "unknown keys" in capsys.readouterr().err
    assert not out.exists()
