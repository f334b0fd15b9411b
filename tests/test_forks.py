"""`lookahead.forks`: a real bf16 near-tie is called one; a planted wrong token is a bug."""

from __future__ import annotations

import math

import torch
from lookahead.forks import explain_fork, first_difference, rounding_bound
from lookahead.hf import LookaheadGenerator
from tiny_models import EOS_ID, tiny_model


def plain(model, ids, n):
    x = torch.tensor([ids])
    with torch.inference_mode():
        out = model.generate(
            x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n,
            eos_token_id=EOS_ID, pad_token_id=0,
        )  # fmt: skip
    return out[0, len(ids) :].tolist()


def test_real_bf16_forks_are_near_ties_within_the_measured_bound():
    torch.manual_seed(0)
    model = tiny_model("llama").to(torch.bfloat16)
    gen = LookaheadGenerator(model, None, budget=16, min_draft_score=0.0)
    g = torch.Generator().manual_seed(1)
    forks = []
    for _ in range(100):
        ids = torch.randint(2, 128, (12,), generator=g).tolist() * 4
        a = plain(model, ids, 40)
        b = gen.generate(ids, max_new_tokens=40, do_sample=False).ids
        if a != b:
            bound = rounding_bound(model, ids)
            forks.append(explain_fork(model, ids, a, b, bound))
        if len(forks) >= 3:
            break
    assert forks, "no bf16 fork in 100 prompts (the test needs one to check)"
    for f in forks:
        assert f.plain_token is not None and f.other_token is not None, f
        assert f.near_tie and abs(f.margin) <= f.bound and f.bound > 0, f
        assert "near-tie" in f.describe()


def test_a_planted_wrong_token_is_a_bug():
    torch.manual_seed(0)
    model = tiny_model("llama")
    ids = list(range(5, 40))
    a = plain(model, ids, 12)
    # Replace token 6 by the token the model likes least there.
    prefix = torch.tensor([ids + a[:6]])
    with torch.inference_mode():
        worst = int(model(input_ids=prefix).logits[0, -1].argmin())
    b = a[:6] + [worst] + a[7:]
    bound = rounding_bound(model, ids + a)
    assert 0 <= bound < 1e-3  # fp32: one-row and multi-row forwards agree closely
    f = explain_fork(model, ids, a, b, bound)
    assert (f.position, f.plain_token, f.other_token) == (6, a[6], worst)
    assert not f.near_tie and f.margin > 1.0 and "BUG" in f.describe()
    assert explain_fork(model, ids, a, list(a), bound) is None
    ended = explain_fork(model, ids, a, a[:5], bound)
    assert ended.other_token is None and not ended.near_tie and math.isnan(ended.margin)


def test_the_first_difference_of_two_outputs():
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([4], [5, 6]) == 0
    assert first_difference([1, 2], [1, 2, 3]) == 2  # a prefix: the shorter one's length
    assert first_difference([1, 2, 3], [1, 2]) == 2
    assert first_difference([7, 8], [7, 8]) == 2 and first_difference([], [1]) == 0
