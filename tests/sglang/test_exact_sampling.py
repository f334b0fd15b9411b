"""Exact sampling verification for LOOKAHEAD batches, in SGLang's accept layout."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
import torch
from lookahead.kernels import verify_sampling_ref

pytest.importorskip("sglang", reason="needs sglang==0.5.23: requirements/sglang-test.txt")


def random_trees(bs, width, gen):
    parents = torch.full((bs, width), -1, dtype=torch.int32)
    for b in range(bs):
        for i in range(1, width):
            parents[b, i] = int(torch.randint(0, i, (1,), generator=gen))
    tokens = torch.randint(0, 6, (bs, width), generator=gen, dtype=torch.int32)
    return tokens, parents


def emitted(res, tokens, b):
    n = int(res.num_accepted[b])
    path = res.accepted_nodes[b, 1 : n + 1].long()
    return tokens[b, path].tolist() + [int(res.bonus[b])]


@pytest.mark.parametrize("bs, width", [(1, 2), (3, 5), (4, 8)])
def test_accept_layout_is_sglangs(bs, width):
    from lookahead.sglang.verify import to_sglang_accept_layout

    gen = torch.Generator().manual_seed(bs * 100 + width)
    tokens, parents = random_trees(bs, width, gen)
    # Peaked target distributions so that paths of several tokens get accepted.
    logits = torch.randn(bs, width, 6, generator=gen) * 4
    probs = torch.softmax(logits, -1)
    uniforms = torch.rand(bs, width, generator=gen)
    nodes = torch.full((bs,), width, dtype=torch.int32)
    res = verify_sampling_ref(tokens, parents, nodes, probs, uniforms)
    predict, accept_lens, accept_index = to_sglang_accept_layout(
        res.accepted_nodes, res.num_accepted, res.bonus, tokens, width
    )
    assert predict.dtype == torch.int32 and predict.shape == (bs * width,)
    assert accept_lens.dtype == torch.int32 and accept_index.dtype == torch.int32
    assert accept_index.shape == (bs, width)
    for b in range(bs):
        n = int(accept_lens[b])
        assert n == int(res.num_accepted[b]) + 1
        assert int(accept_index[b, 0]) == b * width  # the root first
        idx = accept_index[b, :n].long()
        assert (idx // width == b).all()
        assert predict[idx].tolist() == emitted(res, tokens, b)
        assert (accept_index[b, n:] == -1).all()


def test_exact_sample_runs_sglangs_logit_path_then_our_verifier(plugins_loaded, monkeypatch):
    """`exact_tree_sample` on CPU tensors: SGLang's softmax and coins, our verifier.

    The distributed runtime (TP groups, DP-attention flags) does not exist in a CPU test
    process, so those two look-ups are replaced by a single-rank answer."""
    import sglang.srt.layers.dp_attention as dp_attention
    import sglang.srt.runtime_context as runtime_context
    from lookahead.sglang.verify import LookaheadVerifyInput, exact_tree_sample

    one_rank = SimpleNamespace(world_size=1)
    monkeypatch.setattr(dp_attention, "is_dp_attention_enabled", lambda: False)
    monkeypatch.setattr(
        runtime_context,
        "get_parallel",
        lambda: SimpleNamespace(tp_group=one_rank, attn_tp_group=one_rank),
    )
    bs, width, vocab = 3, 5, 7
    gen = torch.Generator().manual_seed(7)
    tokens, parents = random_trees(bs, width, gen)
    logits = torch.randn(bs * width, vocab, generator=gen) * 3
    temperatures = torch.tensor([[0.5], [1.0], [1.7]])
    sampling_info = SimpleNamespace(
        acc_additive_penalties=None,
        acc_scaling_penalties=None,
        logit_bias=None,
        temperatures=temperatures,
        need_top_k_sampling=False,
        need_top_p_sampling=False,
        sampling_seed=None,
    )
    batch = SimpleNamespace(sampling_info=sampling_info, seq_lens=torch.tensor([9, 4, 12]))
    verify_input = LookaheadVerifyInput(
        draft_token=tokens.reshape(-1).long(),
        custom_mask=torch.ones(1, dtype=torch.bool),
        draft_token_num=width,
        tree_tokens=tokens,
        tree_parents=parents,
        exact_sampling=True,
    )
    torch.manual_seed(1234)
    predict, accept_lens, accept_index = exact_tree_sample(
        verify_input, batch, SimpleNamespace(next_token_logits=logits.clone())
    )
    # The same computation by hand: temperature softmax, SGLang's coin draw, our reference.
    torch.manual_seed(1234)
    coins = torch.rand_like(tokens, dtype=torch.float32)
    probs = torch.softmax(logits / temperatures.repeat_interleave(width, 0), -1).view(
        bs, width, vocab
    )
    res = verify_sampling_ref(
        tokens, parents, torch.full((bs,), width, dtype=torch.int32), probs, coins
    )
    for b in range(bs):
        n = int(accept_lens[b])
        assert n == int(res.num_accepted[b]) + 1
        assert predict[accept_index[b, :n].long()].tolist() == emitted(res, tokens, b)

    class Forbid:  # a grammar's mask (SGLang's `GrammarMask.apply`): tokens 0-2 never allowed
        def apply(self, x):
            x[:, :3] = float("-inf")

    for seed in range(20):  # drafts hold tokens 0-5: forbidden ones are drafted often
        torch.manual_seed(seed)
        predict, accept_lens, accept_index = exact_tree_sample(
            verify_input, batch, SimpleNamespace(next_token_logits=logits.clone()), Forbid()
        )
        for b in range(bs):
            out = predict[accept_index[b, : int(accept_lens[b])].long()].tolist()
            assert min(out) >= 3, (seed, b, out)


def test_only_lookahead_sampling_batches_take_our_path_on_cpu_too(plugins_loaded, monkeypatch):
    """NGRAM's inputs stay on SGLang's path; LOOKAHEAD's CPU sampling batches take ours, since
    SGLang's `eagle_sample` verifies every CPU batch greedily (`_verify_uses_greedy`)."""
    import sglang.srt.runtime_context as runtime_context
    from lookahead.sglang import patches, verify
    from lookahead.sglang.verify import LookaheadVerifyInput
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.ngram_info import NgramVerifyInput

    calls = []

    def original(*args, **kwargs):
        calls.append((args, kwargs))
        return "sglang"

    spec = SimpleNamespace(speculative_use_rejection_sampling=False)
    monkeypatch.setattr(runtime_context, "get_spec", lambda: spec)
    monkeypatch.setattr(verify, "exact_tree_sample", lambda vi, b, lo, gm=None: "ours")
    mask = torch.ones(4, dtype=torch.bool)
    ngram = NgramVerifyInput(custom_mask=mask, draft_token_num=2)
    assert patches._exact_sampling(original, ngram, "batch", "logits", None) == "sglang"
    ours = LookaheadVerifyInput(
        custom_mask=mask,
        draft_token_num=2,
        tree_tokens=torch.zeros((1, 2), dtype=torch.int32),
        tree_parents=torch.tensor([[-1, 0]], dtype=torch.int32),
        exact_sampling=True,
    )
    batch = SimpleNamespace(
        forward_mode=ForwardMode.TARGET_VERIFY,
        sampling_info=SimpleNamespace(is_all_greedy=False, has_watermark_candidates=False),
    )
    assert patches._exact_sampling(original, ours, batch, "logits", None) == "ours"
    batch.sampling_info.is_all_greedy = True
    assert (
        patches._exact_sampling(original, ours, batch, "logits", None, watermark_state=None)
        == "sglang"
    )
    assert len(calls) == 2 and calls[1][1] == {"watermark_state": None}


@pytest.mark.parametrize("seed", range(4))
def test_cpu_filters_are_sglangs_cpu_sampler(seed):
    """Top-k, top-p and min-p as SGLang's CPU sampler keeps them (its own function's
    filtered weights, scattered back and renormalised)."""
    from lookahead.sglang.verify import cpu_filtered_probs
    from sglang.srt.layers.sampler import top_k_top_p_min_p_sampling_from_probs_torch

    gen = torch.Generator().manual_seed(seed)
    bs, width, vocab = 3, 2, 11
    probs = torch.softmax(torch.randn(bs * width, vocab, generator=gen) * 2, -1)
    info = SimpleNamespace(
        need_top_k_sampling=True,
        need_top_p_sampling=True,
        need_min_p_sampling=True,
        top_ks=torch.tensor([1, 4, vocab]),
        top_ps=torch.tensor([1.0, 0.6, 0.3]),
        min_ps=torch.tensor([0.0, 0.05, 0.2]),
    )
    got = cpu_filtered_probs(probs.clone(), info, width)
    rep = lambda t: torch.repeat_interleave(t, width, dim=0)  # noqa: E731
    _, kept, idx, _ = top_k_top_p_min_p_sampling_from_probs_torch(
        probs.clone(), rep(info.top_ks), rep(info.top_ps), rep(info.min_ps), True, None,
        torch.zeros(bs * width, dtype=torch.int64), return_filtered_probs=True,
    )  # fmt: skip
    want = torch.zeros_like(probs).scatter_(-1, idx.long(), kept)
    want = want / want.sum(-1, keepdim=True)
    torch.testing.assert_close(got, want)
    assert (got[:width] > 0).sum(-1).tolist() == [1, 1]  # top_k 1 leaves the argmax


def test_cuda_sampling_batches_take_our_path_unless_sglang_must(plugins_loaded, monkeypatch):
    import sglang.srt.runtime_context as runtime_context
    from lookahead.sglang import patches, verify
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.plugins.hook_registry import HookRegistry

    # As a worker with exact_sampling does; then SGLang's own call site must reach our hook
    # (HookRegistry only logs a target it cannot resolve).
    patches.register_patch("exact_sampling")
    HookRegistry.apply_hooks()
    module, _, name = patches.SAMPLE_TARGET.rpartition(".")
    sample = getattr(importlib.import_module(module), name)
    spec = SimpleNamespace(speculative_use_rejection_sampling=False)
    monkeypatch.setattr(runtime_context, "get_spec", lambda: spec)
    monkeypatch.setattr(verify, "exact_tree_sample", lambda vi, b, lo, gm=None: "ours")
    # A CUDA tree without a GPU: only `is_cuda` is read before the sampler.
    vi = verify.LookaheadVerifyInput.__new__(verify.LookaheadVerifyInput)
    vi.exact_sampling, vi.tree_tokens = True, SimpleNamespace(is_cuda=True)
    info = SimpleNamespace(is_all_greedy=False, has_watermark_candidates=True)
    batch = SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY, sampling_info=info)

    def original(*args, **kwargs):
        return "sglang"

    assert patches._exact_sampling(original, vi, batch, "logits", None) == "ours"
    assert sample(vi, batch, "logits", None) == "ours"
    # A grammar's mask is applied by our sampler too (SGLang's CPU verify is argmax).
    assert patches._exact_sampling(original, vi, batch, "logits", "grammar") == "ours"
    # Each feature only SGLang's sampler handles sends the batch there.
    assert patches._exact_sampling(original, vi, batch, "l", None, watermark_state=1) == "sglang"
    spec.speculative_use_rejection_sampling = True
    assert patches._exact_sampling(original, vi, batch, "logits", None) == "sglang"
    spec.speculative_use_rejection_sampling = False
    vi.exact_sampling = False
    assert patches._exact_sampling(original, vi, batch, "logits", None) == "sglang"
    vi.exact_sampling, info.is_all_greedy = True, True
    assert patches._exact_sampling(original, vi, batch, "logits", None) == "sglang"
