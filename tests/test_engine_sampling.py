"""Sampling through lookahead keeps the model's distribution (statistical tests).

A tiny model with a 12-token vocabulary samples 3 new tokens from a fixed prompt, 800 times
with lookahead (seed i for run i) and 800 times with plain `model.generate(do_sample=True)`.
A chi-square homogeneity test compares the joint distribution of (token 1, token 2) and of
(token 2, token 3). Under the null each test's p-value is uniform, so with the threshold 1e-4
the chance that a correct engine fails for a fresh choice of seeds is at most 2 x 1e-4 per
setting (0.04 % for the two settings); with the fixed seeds here the test is deterministic.
A control checks that the same test does reject a wrong distribution (temperature 0.7 vs 1).
"""

from __future__ import annotations

import collections

import pytest
import torch
from lookahead import Draft, LookaheadCache
from lookahead.hf import LookaheadGenerator
from tiny_models import ScriptedCache, bounded, tiny_model

VOCAB = 12
RUNS = 800
NEW = 3
PROMPT = [3, 4, 5, 3, 4, 5, 3, 4, 5, 3, 4]
ALPHA = 1e-4


pytestmark = pytest.mark.usefixtures("verify_every_draft", "one_torch_thread")


@pytest.fixture(scope="module")
def model():
    # A moderate init keeps every token likely enough to appear, yet peaked enough that
    # drafts are accepted.
    return tiny_model("llama", seed=21, vocab_size=VOCAB, init_std=0.15)


def chi2_homogeneity_pvalue(a: collections.Counter, b: collections.Counter) -> float:
    """p-value of 'a and b come from one distribution' (equal sample sizes).

    Cells with fewer than 10 observations in total are pooled into one cell.
    """
    cells = set(a) | set(b)
    big = [c for c in cells if a[c] + b[c] >= 10]
    pooled_a = sum(a[c] for c in cells if c not in big)
    pooled_b = sum(b[c] for c in cells if c not in big)
    pairs = [(a[c], b[c]) for c in big] + ([(pooled_a, pooled_b)] if pooled_a + pooled_b else [])
    stat = sum((x - y) ** 2 / (x + y) for x, y in pairs)
    df = len(pairs) - 1
    if df < 1:
        return 1.0
    # The chi-square survival function: 1 - P(df/2, stat/2) (regularised lower gamma).
    return float(torch.special.gammaincc(torch.tensor(df / 2.0), torch.tensor(stat / 2.0)))


def plain_samples(model, **kw) -> list:
    inp = torch.tensor([PROMPT])
    out = []
    for i in range(RUNS):
        torch.manual_seed(i)
        with torch.inference_mode():
            o = model.generate(
                inp,
                attention_mask=torch.ones_like(inp),
                do_sample=True,
                max_new_tokens=NEW,
                eos_token_id=None,
                pad_token_id=0,
                **kw,
            )
        out.append(tuple(o[0, len(PROMPT) :].tolist()))
    return out


def lookahead_samples(model, cache_factory, **kw) -> tuple:
    out, accepted = [], 0
    for i in range(RUNS):
        gen = LookaheadGenerator(model, cache=cache_factory(), budget=6)
        res = gen.generate(
            PROMPT, max_new_tokens=NEW, eos_token_id=None, do_sample=True, seed=i, **kw
        )
        out.append(tuple(res.ids))
        accepted += sum(res.stats.accepted)
    return out, accepted


def pvalues(x: list, y: list) -> tuple:
    p12 = chi2_homogeneity_pvalue(
        collections.Counter(s[:2] for s in x), collections.Counter(s[:2] for s in y)
    )
    p23 = chi2_homogeneity_pvalue(
        collections.Counter(s[1:] for s in x), collections.Counter(s[1:] for s in y)
    )
    return p12, p23


class _FixedTreeCache(ScriptedCache):
    """Drafts the same multi-branch tree after every context: 3 children, 2 grandchildren."""

    def __init__(self):
        super().__init__([], VOCAB)

    def draft(self, rid, budget=16, multi_branch=True, *, vocab=None, max_depth=None):
        import numpy as np

        toks = [self.ctx[-1], 3, 4, 5, 4, 5, 3]
        pars = [-1, 0, 0, 0, 1, 2, 4]
        d = Draft(
            np.array(toks, dtype=np.int32),
            np.array(pars, dtype=np.int32),
            np.zeros(len(toks), dtype=np.float32),
            len(toks),
        )
        return bounded(d, vocab, max_depth)


SETTINGS = {
    "plain": {},
    "processed": {"temperature": 0.7, "top_k": 6, "top_p": 0.9, "repetition_penalty": 1.3},
}


@pytest.fixture(scope="module")
def references(model):
    return {name: plain_samples(model, **kw) for name, kw in SETTINGS.items()}


@pytest.mark.parametrize(
    ("setting", "drafts"), [("plain", "trie"), ("plain", "fixed_tree"), ("processed", "fixed_tree")]
)
def test_sampling_matches_plain_sampling(model, references, setting, drafts):
    # One trie for all runs: earlier outputs become drafts; they are independent of the
    # current run's draws, so sampling stays exact.
    shared = LookaheadCache(max_depth=6)
    factory = (lambda: shared) if drafts == "trie" else _FixedTreeCache
    ours, accepted = lookahead_samples(model, factory, **SETTINGS[setting])
    # Without accepted drafts this would only test plain sampling again.
    assert accepted > RUNS // 5, f"only {accepted} draft tokens accepted in {RUNS} runs"
    p12, p23 = pvalues(ours, references[setting])
    assert min(p12, p23) > ALPHA, f"{setting}/{drafts}: p-values {p12:.2e}, {p23:.2e}"


def test_the_statistical_test_has_power(references):
    # Temperature 0.7 (+ top-k/top-p/penalty) against temperature 1 must be rejected.
    p12, p23 = pvalues(references["plain"], references["processed"])
    assert min(p12, p23) < ALPHA


def test_sampling_is_reproducible_with_a_seed(model):
    a = LookaheadGenerator(model).generate(PROMPT, max_new_tokens=8, do_sample=True, seed=5)
    b = LookaheadGenerator(model).generate(PROMPT, max_new_tokens=8, do_sample=True, seed=5)
    assert a.ids == b.ids


def test_a_seed_gives_one_output_whatever_the_drafts(model):
    # Output position i takes the i-th uniform of the seeded stream: the same output from a
    # generator whose shared history grows between calls (so its trees differ), and from
    # plain decoding (budget 0).
    gen = LookaheadGenerator(model, min_draft_score=0)
    kw = dict(max_new_tokens=30, do_sample=True, temperature=0.7, seed=123, eos_token_id=None)
    runs = [gen.generate(PROMPT, **kw) for _ in range(3)]
    plain = LookaheadGenerator(model, budget=0).generate(PROMPT, **kw)
    assert sum(runs[-1].stats.accepted) > sum(runs[0].stats.accepted)  # the trees did differ
    assert all(r.ids == plain.ids for r in runs)


def test_sampling_leaves_the_global_generator_alone(model):
    torch.manual_seed(0)
    want = torch.rand(1).item()
    torch.manual_seed(0)
    LookaheadGenerator(model).generate(PROMPT, max_new_tokens=4, do_sample=True)  # no seed
    assert torch.rand(1).item() == want
