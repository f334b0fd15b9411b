"""The llama.cpp engine on a tiny random GGUF model written here: greedy lookahead equals
llama.cpp's own greedy decoding token for token, trees are verified in one forward, the KV
cache keeps no stale entry, and bad inputs fail clearly."""

from __future__ import annotations

import numpy as np
import pytest
from lookahead import LookaheadCache
from lookahead.errors import ModelLoadError
from lookahead.sizing import FixedSizer

pytest.importorskip("llama_cpp", reason="needs the llamacpp extra (make llamacpp)")

from lookahead.llamacpp import LlamaCppGenerator, LlamaCppModel, plain_generate  # noqa: E402
from tiny_gguf import write_tiny_llama  # noqa: E402

VOCAB = 97


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    # A head tied to the embeddings: the model tends to repeat what it has seen, so drafts
    # from the context get accepted and trees of several branches are verified.
    return write_tiny_llama(tmp_path_factory.mktemp("gguf") / "tiny.gguf", vocab=VOCAB,
                            repeat_bias=3.0)  # fmt: skip


@pytest.fixture(scope="module")
def plain_model(gguf_path):
    m = LlamaCppModel(gguf_path, n_ctx=1024, n_threads=2, n_seq_max=1)
    yield m
    m.close()


@pytest.fixture(scope="module")
def model(gguf_path):
    m = LlamaCppModel(gguf_path, n_ctx=1024, n_threads=2)
    yield m
    m.close()


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    """Prompts that repeat a phrase, as copy-heavy text does."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        phrase = rng.integers(0, VOCAB, size=int(rng.integers(4, 12))).tolist()
        noise = rng.integers(0, VOCAB, size=int(rng.integers(0, 6))).tolist()
        out.append(noise + phrase * 3 + noise[:2] + phrase[:3])
    return out


def test_greedy_lookahead_equals_llama_cpp_greedy(model, plain_model):
    gen = LlamaCppGenerator(model, sizer=FixedSizer(8, 16))
    accepted = trees = 0
    for ids in prompts(6):
        want = plain_generate(plain_model, ids, 48)
        res = gen.generate(ids, max_new_tokens=48)
        assert res.ids == want, ids
        accepted += sum(res.stats.accepted)
        trees += sum(1 for n in res.stats.draft_nodes if n > 1)
        assert res.stats.steps < len(res.ids)  # drafts saved forwards
    assert accepted > 0 and trees > 0


def test_a_long_generation_keeps_no_stale_cache_entry(model, plain_model):
    # Hundreds of steps of rejected branches: any cell left behind would change later logits.
    ids = prompts(1, seed=3)[0]
    gen = LlamaCppGenerator(model, cache=LookaheadCache(), sizer=FixedSizer(16, 32))
    res = gen.generate(ids, max_new_tokens=400)
    assert res.ids == plain_generate(plain_model, ids, 400)
    rejected = sum(res.stats.draft_nodes) - sum(res.stats.accepted)
    assert rejected >= 100, res.stats  # that many nodes verified, then dropped from the cache


def test_streaming_gives_every_token_once(model):
    seen = []
    res = LlamaCppGenerator(model).generate(
        prompts(1)[0], 30, on_tokens=lambda t, s: seen.extend(t)
    )
    assert seen == res.ids and len(res.ids) == 30 and res.finish_reason == "length"


def test_bad_files_fail_in_one_line(tmp_path, gguf_path):
    with pytest.raises(ModelLoadError, match="not found"):
        LlamaCppModel(tmp_path / "missing.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model at all")
    with pytest.raises(ModelLoadError, match="not a GGUF"):
        LlamaCppModel(junk)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(gguf_path.read_bytes()[:5000])
    with pytest.raises(ModelLoadError, match="could not load"):
        LlamaCppModel(cut)


def test_bad_requests_fail_before_any_forward(model):
    gen = LlamaCppGenerator(model)
    with pytest.raises(ValueError, match="exceeds the context"):
        gen.generate([1] * 1000, max_new_tokens=100)
    with pytest.raises(ValueError, match="token ids"):
        gen.generate([1, VOCAB + 5], max_new_tokens=4)
    with pytest.raises(ValueError, match="at least one token"):
        gen.generate([], max_new_tokens=4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        gen.generate([1, 2], max_new_tokens=0)
    # and the model still serves
    assert len(gen.generate([1, 2, 3], max_new_tokens=5).ids) == 5
