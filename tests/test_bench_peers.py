"""Peer adapters and simulator pieces: tree acceptance, the copy-oracle, vLLM and PLD."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.peers import accepted_length, chain, check_tree
from benchmarks.peers.oracle import CopyOracle
from benchmarks.peers.vllm_ngram import VllmNgramDrafter, find_longest_matched_ngram


def test_accepted_length_chain_and_tree():
    toks, pars = chain([5, 6, 7])
    assert pars == [-1, 0, 1]
    assert accepted_length(toks, pars, [5, 6, 7, 8]) == 3
    assert accepted_length(toks, pars, [5, 6, 9]) == 2
    assert accepted_length(toks, pars, [4]) == 0
    assert accepted_length([], [], [1, 2]) == 0
    # Root has children 5 and 8; 8 -> 9 -> 10 is the accepted branch.
    toks, pars = [5, 8, 6, 9, 10], [-1, -1, 0, 1, 3]
    assert accepted_length(toks, pars, [8, 9, 10, 11]) == 3
    assert accepted_length(toks, pars, [5, 6, 1]) == 2
    # Truth shorter than the tree: capped by the truth.
    assert accepted_length(toks, pars, [8, 9]) == 2


def test_accepted_length_follows_duplicate_siblings():
    # Two children with token 0 (SGLang pads with such leaves); the second one leads further.
    toks, pars = [0, 0, 3], [-1, -1, 1]
    assert accepted_length(toks, pars, [0, 3, 4]) == 2


def test_accepted_length_rejects_bad_parents():
    with pytest.raises(ValueError, match="parents must come first"):
        accepted_length([1, 2], [-1, 1], [1, 2])


def test_check_tree_budget():
    check_tree("x", [1, 2], [-1, 0], 2)
    with pytest.raises(AssertionError, match="budget"):
        check_tree("x", [1, 2, 3], [-1, 0, 1], 2)


# The documented cases of vLLM's tests/v1/spec_decode/test_ngram.py.
VLLM_CASES = [
    ([1, 2, 3, 4, 1, 2, 3, 5, 6], 2, 2, 2, []),
    ([1, 2, 3, 4, 1, 2, 3], 2, 2, 3, [4, 1, 2]),
    ([1, 2, 3, 4, 1, 2, 3], 2, 2, 2, [4, 1]),
    ([1, 2, 3, 4, 1, 2, 3], 1, 1, 3, [4, 1, 2]),
    ([1, 2, 3, 4, 1, 2, 3], 1, 1, 2, [4, 1]),
    ([1, 3, 6, 2, 3, 4, 1, 2, 3], 2, 2, 3, [4, 1, 2]),
    ([1, 3, 6, 2, 3, 4, 1, 2, 3], 1, 1, 2, [6, 2]),  # the first match wins
    ([1, 2, 3, 4, 5], 2, 2, 2, []),
    ([1, 2, 3, 4, 1, 2, 3], 4, 4, 2, []),
    ([1, 2, 3, 4, 1, 2, 3], 3, 4, 2, [4, 1]),
    ([2, 3, 4, 5, 1, 2, 3, 4, 1, 2, 3, 4], 3, 4, 2, [1, 2]),  # the 4-gram, not [5, 1]
    ([3, 4, 5, 2, 3, 4, 1, 2, 3, 4], 2, 4, 2, [1, 2]),
    ([1, 2, 3, 100, 1, 2, 3, 200, 1, 2, 3, 300, 1, 2, 3], 3, 3, 2, [100, 1]),
]


@pytest.mark.parametrize("tokens,min_n,max_n,k,expected", VLLM_CASES)
def test_vllm_ngram_matches_vllm_tests(tokens, min_n, max_n, k, expected):
    got = find_longest_matched_ngram(np.array(tokens, dtype=np.int32), min_n, max_n, 1024, k)
    assert got.tolist() == expected


def _vllm_brute(ctx, min_n, max_n, k):
    """Longest n in [min_n, max_n] whose suffix occurs earlier; earliest occurrence wins."""
    n_tok = len(ctx)
    for n in range(min(max_n, n_tok - 1), min_n - 1, -1):
        suffix = ctx[n_tok - n :]
        for j in range(0, n_tok - n):
            if ctx[j : j + n] == suffix:
                return ctx[j + n : j + n + k]
    return []


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 3), min_size=1, max_size=40),
    st.integers(1, 4),
    st.integers(0, 3),
    st.integers(1, 6),
)
def test_vllm_ngram_equals_brute_force(ctx, min_n, extra, k):
    max_n = min_n + extra
    got = find_longest_matched_ngram(np.array(ctx, dtype=np.int32), min_n, max_n, 1 << 20, k)
    assert got.tolist() == _vllm_brute(ctx, min_n, max_n, k)


def test_vllm_drafter_chain_and_budget():
    d = VllmNgramDrafter(min_n=1, max_n=5)
    toks, pars = d.draft(0, np.array([1, 2, 3, 4, 1, 2, 3], dtype=np.int32), 2)
    assert (toks, pars) == ([4, 1], [-1, 0])
    with pytest.raises(ValueError):
        VllmNgramDrafter(min_n=3, max_n=2)


def test_pld_calls_transformers_generator():
    pytest.importorskip("torch")
    from benchmarks.peers.pld import PldDrafter

    d = PldDrafter(num_output_tokens=10, eos_token_id=99)
    # Last bigram (1, 2) first occurs at 0: propose what follows, up to the context end.
    ctx = np.array([1, 2, 3, 4, 5, 1, 2], dtype=np.int32)
    assert d.draft(0, ctx, 16)[0] == [3, 4, 5, 1, 2]
    assert d.draft(0, ctx, 3)[0] == [3, 4, 5]  # the budget caps the default 10 tokens
    # Drafts stop before eos, as in HF generate.
    ctx = np.array([1, 2, 3, 99, 5, 1, 2], dtype=np.int32)
    assert d.draft(0, ctx, 16)[0] == [3]
    # Falls back to a unigram match, and to no draft at all.
    assert d.draft(0, np.array([7, 8, 9, 7], dtype=np.int32), 16)[0] == [8, 9, 7]
    assert d.draft(0, np.array([1, 2, 3], dtype=np.int32), 16) == ([], [])
    b = PldDrafter(num_output_tokens=None)
    ctx = np.array([1, 2] + list(range(10, 30)) + [1, 2], dtype=np.int32)
    assert len(b.draft(0, ctx, 16)[0]) == 16  # "B tokens": as many as the budget


def _oracle_brute(history, prompt, output, pos, cap):
    seen_docs = [*history, list(prompt) + list(output[:pos])]
    last = seen_docs[-1][-1]
    best = 0
    for length in range(1, cap + 1):
        pat = [last, *output[pos : pos + length]]
        if any(
            doc[j : j + len(pat)] == pat
            for doc in seen_docs
            for j in range(len(doc) - len(pat) + 1)
        ):
            best = length
        else:
            break
    return best


def test_copy_oracle_examples():
    o = CopyOracle(max_budget=4)
    # Second half repeats the first: at pos 5 the context ends with 1 and the continuation
    # 2, 3, 4 follows the earlier 1; the bonus token must stay, so the cap is len - pos - 1.
    out = np.array([1, 2, 3, 4, 1, 2, 3, 4, 9])
    lens = o.lengths(np.array([7]), out)
    assert lens[5] == 3
    assert lens[4] == 0  # "4 1" was never seen: the future may not be copied
    # A later request sees the first one's output: "2 3 4 9" occurs there.
    lens2 = o.lengths(np.array([5, 1]), np.array([2, 3, 4, 9, 0]))
    assert lens2[1] == 3


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.integers(0, 3), min_size=1, max_size=12),
            st.lists(st.integers(0, 3), min_size=1, max_size=12),
        ),
        min_size=1,
        max_size=3,
    ),
    st.integers(1, 5),
)
def test_copy_oracle_equals_brute_force(requests, budget):
    o = CopyOracle(max_budget=budget)
    history = []
    for prompt, output in requests:
        lens = o.lengths(np.array(prompt), np.array(output))
        for pos in range(1, len(output)):
            cap = min(budget, len(output) - pos - 1)
            assert lens[pos] == _oracle_brute(history, prompt, output, pos, cap), (pos, lens)
        history.append(list(prompt) + list(output))  # one document: output after prompt


def test_sglang_mask_to_parents():
    from benchmarks.peers.sglang_ngram import mask_to_parents

    mask = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]])
    assert mask_to_parents(mask) == [-1, 0, 0, 1]


def test_suffix_decoding_real_tree():
    pytest.importorskip("arctic_inference.suffix_decoding")
    from benchmarks.peers.suffix_decoding import SuffixDecodingDrafter

    for tree in (False, True):
        d = SuffixDecodingDrafter(tree=tree)
        d.start_request(0, np.array([1, 2, 3, 4, 5, 1, 2, 3, 4, 5], dtype=np.int32))
        d.extend(0, None, np.array([1, 2], dtype=np.int32))
        ctx = np.array([1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2], dtype=np.int32)
        toks, pars = d.draft(0, ctx, 3)
        assert toks == [3, 4, 5] and pars == [-1, 0, 1]
        d.finish_request(0)


def test_hostcost_history_stream_and_step_vs_scan_rows():
    from benchmarks.peers.hostcost import history_stream, step_vs_scan_rows

    s = np.arange(10, dtype=np.int32)
    h = history_stream(s, 25)
    assert h.size == 25 and h[10] == 1_000_000 and h[24] == 2_000_004
    rows = step_vs_scan_rows(np.tile(np.arange(50, dtype=np.int32), 8), [64, 128], 8, 40, rounds=4)
    timed = [(r["what"], r["path"]) for r in rows if r["unit"] == "us"]
    assert timed == [
        (f"{w} ctx {n}", p)
        for n in (64, 128)
        for w, p in (("step", "ours-api"), ("step", "ours-step"), ("draft", "vllm5-5"),
                     ("draft", "vllm1-5"))
    ]  # fmt: skip
    assert all(r["p99"] >= r["p50"] > 0 for r in rows if r["unit"] == "us")
    ratios = [r for r in rows if r["unit"] == "x"]
    assert [r["path"] for r in ratios] == ["ours-step/vllm5-5", "ours-step/vllm1-5"] * 2
    assert all(r["rounds"] == 4 and r["min"] <= r["median"] <= r["max"] for r in ratios)


def test_copy_oracle_first_seen_bigrams():
    o = CopyOracle(max_budget=4)
    o.lengths(np.array([1, 2]), np.array([3, 4]))  # history: bigrams 1-2 and 3-4
    first = o.first_seen(np.array([9, 1]), np.array([2, 5, 6, 5, 6, 3, 4]))
    # Index 0 is the prefill's token (never drafted); 2-5 first at index 1 (seen once pos > 1);
    # 5-6 at 2; 6-5 at 3; 5-6 again at 4 (seen from pos 3 on); 6-3 at 5; 3-4 in history.
    assert first.tolist() == [0, 2, 3, 4, 3, 6, 0]


def test_copy_oracle_counts_the_prompt_output_boundary_as_seen():
    # The prefill's token follows the prompt before any draft: the bigram across the boundary
    # (1-2) is seen from the first step on, in this request and in later ones.
    o = CopyOracle(max_budget=4)
    assert o.first_seen(np.array([7, 1]), np.array([2, 3, 1, 2])).tolist() == [0, 2, 3, 0]
    o.lengths(np.array([7, 1]), np.array([2, 3, 1, 2]))
    assert o.first_seen(np.array([5, 8]), np.array([4, 1, 2])).tolist() == [0, 2, 0]
    # ... and a copy may run across an earlier request's boundary: after 7 (output[1]), the
    # seen text "7 1 | 2 3 1 2" continues 1 2 3 (cap 3); with prompt and output apart, 1.
    assert o.lengths(np.array([9, 8]), np.array([5, 7, 1, 2, 3, 0]))[2] == 3
