"""The verify input LOOKAHEAD hands to SGLang, built by our kernels, and exact sampling.

`build_verify_tensors` turns a batch of draft trees (host arrays in NGRAM's padding
convention, see `drafter.py`) into the tensors of SGLang's `NgramVerifyInput` with one
`tree_metadata` launch and one `build_full_mask` launch for the whole batch, in place of
NGRAM's `reconstruct_indices_from_tree_mask` plus its per-request Python mask loop. The
values are NGRAM's for the same trees: node 0 is the last verified token, positions are
`seq_len + depth`, `retrieve_index = b * N + i`, first-child / next-sibling links (save
that none reaches a padding node), and the full mask is per request `N x (seq_len + N)`
(prefix ones, then the ancestor mask).

`exact_tree_sample` replaces SGLang's `tree_speculative_sampling_target_only` for
LOOKAHEAD's non-greedy batches with `lookahead.kernels.verify_sampling` (one inverse-CDF
draw per visited node, accept the first child carrying it), which emits tokens distributed
exactly as the target's sampling would, and returns SGLang's `(predict, accept_lens,
accept_index)` layout. It runs after the verify forward, outside the CUDA graph; it has
fixed shapes and no host synchronisation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from sglang.srt.speculative.ngram_info import NgramVerifyInput

from lookahead.kernels import build_full_mask, tree_metadata, verify_sampling

__all__ = [
    "LookaheadVerifyInput",
    "VerifyTensors",
    "build_verify_tensors",
    "exact_tree_sample",
    "host_tree",
    "pad_to_width",
    "takes_exact_path",
    "to_sglang_accept_layout",
]


class LookaheadVerifyInput(NgramVerifyInput):
    """`NgramVerifyInput` plus the draft tree itself (for exact sampling verification).

    SGLang treats it exactly as NGRAM's (same `spec_input_type`, fields and methods).
    """

    def __init__(
        self,
        *args: Any,
        tree_tokens: torch.Tensor | None = None,
        tree_parents: torch.Tensor | None = None,
        tree_num_nodes: torch.Tensor | None = None,
        exact_sampling: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.tree_tokens = tree_tokens
        self.tree_parents = tree_parents
        self.tree_num_nodes = tree_num_nodes
        self.exact_sampling = exact_sampling


@dataclass
class VerifyTensors:
    """Device tensors of one verify step, laid out as SGLang's NGRAM worker lays them out."""

    draft_tokens: torch.Tensor  # int64 [B * N]
    positions: torch.Tensor  # int64 [B * N]
    retrieve_index: torch.Tensor  # int64 [B, N]
    retrieve_next_token: torch.Tensor  # int64 [B, N]
    retrieve_next_sibling: torch.Tensor  # int64 [B, N]
    custom_mask: torch.Tensor  # bool, flat: full mask or [B, N, N] tree mask
    tree_tokens: torch.Tensor  # int32 [B, N]
    tree_parents: torch.Tensor  # int32 [B, N]
    num_nodes: torch.Tensor  # int32 [B]: each tree's real nodes, the rest padding


def build_verify_tensors(
    tokens: np.ndarray,
    parents: np.ndarray,
    seq_lens: torch.Tensor,
    seq_lens_sum: int,
    *,
    full_mask: bool,
    num_nodes: np.ndarray | None = None,
) -> VerifyTensors:
    """Verify tensors for B trees of width N, the first `num_nodes[b]` nodes of tree b real
    (None: all). Laid out as NGRAM's, padding included (token 0, a child of the root), but
    no link reaches a padding node (`retrieve_next_token` / `_sibling`): under NGRAM's
    convention padding is a draft of token 0 that a model predicting token 0 accepts.

    `tokens`, `parents`: int32 [B, N] host arrays; `seq_lens`: verified lengths [B] on the
    target device; `seq_lens_sum` their sum (from the host, so no sync). `full_mask` selects
    the flattened `N x (seq_len + N)` mask per request (what SGLang's NGRAM builds for
    attention backends that take a full mask) over the `N x N` tree mask.
    """
    if tokens.shape != parents.shape or tokens.ndim != 2:
        raise ValueError(f"tokens {tokens.shape} and parents {parents.shape} must be [B, N]")
    bs, width = tokens.shape
    device = seq_lens.device
    tree_tokens = torch.from_numpy(np.ascontiguousarray(tokens, dtype=np.int32)).to(
        device, non_blocking=True
    )
    tree_parents = torch.from_numpy(np.ascontiguousarray(parents, dtype=np.int32)).to(
        device, non_blocking=True
    )
    full = torch.full((bs,), width, dtype=torch.int32, device=device)
    meta = tree_metadata(tree_parents, full, seq_lens)  # NGRAM's layout: padding as nodes
    next_token, next_sibling = meta.retrieve_next_token.long(), meta.retrieve_next_sibling.long()
    if num_nodes is None:
        num_nodes = full
    else:
        num_nodes = torch.from_numpy(np.clip(np.asarray(num_nodes, dtype=np.int32), 1, width))
        num_nodes = num_nodes.to(device, non_blocking=True)
        # Padding is the tail of each row and a node's children and later siblings come in
        # index order, so a link at or past num_nodes leads to padding alone: cut it.
        real = num_nodes.long()[:, None]
        next_token = torch.where(next_token >= real, -1, next_token)
        next_sibling = torch.where(next_sibling >= real, -1, next_sibling)
    if full_mask:
        custom_mask = build_full_mask(tree_parents, full, seq_lens, seq_lens_sum=seq_lens_sum)
    else:
        custom_mask = meta.mask.reshape(-1)
    return VerifyTensors(
        draft_tokens=tree_tokens.reshape(-1).long(),
        positions=meta.positions.reshape(-1),
        retrieve_index=meta.retrieve_index.long(),
        retrieve_next_token=next_token,
        retrieve_next_sibling=next_sibling,
        custom_mask=custom_mask,
        tree_tokens=tree_tokens,
        tree_parents=tree_parents,
        num_nodes=num_nodes,
    )


def to_sglang_accept_layout(
    accepted_nodes: torch.Tensor,
    num_accepted: torch.Tensor,
    bonus: torch.Tensor,
    tree_tokens: torch.Tensor,
    depth_cols: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Our `VerifyResult` fields -> SGLang's `(predict, accept_lens, accept_index)`.

    SGLang's contract (verify_tree_greedy / tree_speculative_sampling): `accept_index[b, k]`
    is the flat index `b * N + node` of the k-th node on the accepted path (root first), -1
    past `accept_lens[b] = num_accepted[b] + 1`; `predict[b * N + node]` is the token emitted
    after that node (the next accepted draft token, or the bonus after the last one), so the
    step's tokens are `predict[accept_index[b, :accept_lens[b]]]`. No host sync.
    """
    bs, width = tree_tokens.shape
    device = tree_tokens.device
    k = torch.arange(width, device=device)
    nacc = num_accepted.to(torch.int64)
    on_path = k[None, :] <= nacc[:, None]
    nodes = accepted_nodes.to(torch.int64)
    flat = torch.where(on_path, nodes + (torch.arange(bs, device=device) * width)[:, None], -1)
    next_nodes = torch.cat([nodes[:, 1:], torch.full_like(nodes[:, :1], -1)], dim=1)
    next_tok = tree_tokens.to(torch.int64).gather(1, next_nodes.clamp(min=0))
    emitted = torch.where(k[None, :] < nacc[:, None], next_tok, bonus.to(torch.int64)[:, None])
    # Off-path entries scatter into one spare slot that is cut off afterwards.
    spare = bs * width
    predict = torch.zeros(spare + 1, dtype=torch.int32, device=device)
    predict.scatter_(
        0, torch.where(on_path, flat, spare).reshape(-1), emitted.to(torch.int32).reshape(-1)
    )
    accept_index = torch.full((bs, depth_cols), -1, dtype=torch.int32, device=device)
    cols = min(depth_cols, width)
    accept_index[:, :cols] = flat[:, :cols].to(torch.int32)
    accept_lens = (num_accepted.to(torch.int32) + 1).to(torch.int32)
    return predict[:spare], accept_lens, accept_index


def takes_exact_path(verify_input: Any, batch: Any, grammar_mask: Any, kwargs: dict) -> bool:
    """Whether a LOOKAHEAD verify goes to our exact sampler: enabled, a non-greedy batch, and
    none of the features SGLang's sampler handles that ours does not (watermark, rejection
    sampling with draft probabilities, simulated acceptance). On CPU this is the only exact
    path: SGLang's `eagle_sample` verifies every CPU batch greedily (`_verify_uses_greedy`),
    so a sampled request would get argmax tokens (a grammar's vocabulary mask is applied
    here as there)."""
    from sglang.srt.runtime_context import get_spec
    from sglang.srt.speculative.spec_utils import SIMULATE_ACC_LEN

    if not verify_input.exact_sampling or verify_input.tree_tokens is None:
        return False
    if batch.forward_mode.is_idle() or batch.sampling_info.is_all_greedy:
        return False
    if kwargs.get("watermark_state") is not None and batch.sampling_info.has_watermark_candidates:
        return False
    if get_spec().speculative_use_rejection_sampling or SIMULATE_ACC_LEN > 0:
        return False
    return True


def cpu_filtered_probs(probs: torch.Tensor, sampling_info: Any, width: int) -> torch.Tensor:
    """Top-k, top-p and min-p as SGLang's CPU sampler applies them
    (`top_k_top_p_min_p_sampling_from_probs_torch`: both cuts on the sorted probabilities,
    top-p on the unfiltered cumulative mass, then min-p against the largest), renormalised.
    SGLang has no CPU renorm kernels (`kernels/ops/sampling/renorm.py` leaves them None)."""
    need_k = sampling_info.need_top_k_sampling
    need_p = sampling_info.need_top_p_sampling
    need_min_p = getattr(sampling_info, "need_min_p_sampling", False)
    if not (need_k or need_p or need_min_p):
        return probs
    sort, idx = probs.sort(dim=-1, descending=True)
    csum = sort.cumsum(dim=-1)
    if need_k:
        ks = torch.repeat_interleave(sampling_info.top_ks, width, dim=0).view(-1, 1)
        sort[torch.arange(sort.shape[-1], device=sort.device).view(1, -1) >= ks] = 0.0
    if need_p:
        ps = torch.repeat_interleave(sampling_info.top_ps, width, dim=0).view(-1, 1)
        sort[(csum - sort) > ps] = 0.0
    if need_min_p:
        mins = torch.repeat_interleave(sampling_info.min_ps, width, dim=0).view(-1, 1)
        sort[sort < sort[:, :1] * mins] = 0.0
    out = torch.zeros_like(probs).scatter_(-1, idx, sort)
    return out / out.sum(dim=-1, keepdim=True)


def exact_tree_sample(
    verify_input: LookaheadVerifyInput, batch: Any, logits_output: Any, grammar_mask: Any = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SGLang's `eagle_sample` for LOOKAHEAD's sampling batches, with exact tree verification.

    Logit processing is SGLang's own (penalties, logit bias, the grammar's vocabulary mask of
    every tree node, temperature softmax, top-k and top-p renormalisation, the seeded coins),
    so only the acceptance rule differs.
    """
    from sglang.srt.layers.dp_attention import is_dp_attention_enabled
    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.sampling.penaltylib.repetition_penalty import apply_scaling_penalties
    from sglang.srt.speculative import eagle_utils
    from sglang.srt.utils.async_probe import sanitize_nan_logits

    sampling_info = batch.sampling_info
    width = verify_input.draft_token_num
    bs = len(batch.seq_lens)
    logits = logits_output.next_token_logits
    sanitize_nan_logits(logits, "verify: target model logits")
    if sampling_info.acc_additive_penalties is not None:
        logits.add_(torch.repeat_interleave(sampling_info.acc_additive_penalties, width, dim=0))
    if sampling_info.acc_scaling_penalties is not None:
        apply_scaling_penalties(
            logits, torch.repeat_interleave(sampling_info.acc_scaling_penalties, width, dim=0)
        )
    if sampling_info.logit_bias is not None:
        logits.add_(torch.repeat_interleave(sampling_info.logit_bias, width, dim=0))
    if grammar_mask is not None:
        grammar_mask.apply(logits)
    temperature = torch.repeat_interleave(sampling_info.temperatures, width, dim=0)
    probs = eagle_utils.sampling_softmax(logits, temperatures=temperature)
    if not probs.is_cuda:  # SGLang has no CPU renorm kernels: top-k, top-p, min-p here
        probs = cpu_filtered_probs(probs, sampling_info, width)
    else:
        if sampling_info.need_top_k_sampling:
            probs = eagle_utils.top_k_renorm_prob(
                probs, torch.repeat_interleave(sampling_info.top_ks, width, dim=0)
            )
        if sampling_info.need_top_p_sampling:
            probs = eagle_utils.top_p_renorm_prob(
                probs, torch.repeat_interleave(sampling_info.top_ps, width, dim=0)
            )
    probs = probs.reshape(bs, width, -1)
    coins, _ = eagle_utils._verify_coins(
        sampling_info=sampling_info,
        seq_lens=batch.seq_lens,
        draft_token_num=width,
        candidates=verify_input.tree_tokens,
        device=probs.device,
    )
    num_nodes = verify_input.tree_num_nodes
    if num_nodes is None:
        num_nodes = torch.full((bs,), width, dtype=torch.int32, device=probs.device)
    res = verify_sampling(
        verify_input.tree_tokens, verify_input.tree_parents, num_nodes, probs, coins
    )
    predict, accept_lens, accept_index = to_sglang_accept_layout(
        res.accepted_nodes,
        res.num_accepted,
        res.bonus,
        verify_input.tree_tokens,
        verify_input.max_tree_depth,
    )
    # Ranks draw different coins; rank 0's result must win everywhere, as in SGLang.
    tp_group = (
        get_parallel().attn_tp_group if is_dp_attention_enabled() else get_parallel().tp_group
    )
    if tp_group.world_size > 1:
        num_correct = accept_lens - 1
        tp_group.broadcast(predict, src=0)
        tp_group.broadcast(accept_index, src=0)
        tp_group.broadcast(num_correct, src=0)
        accept_lens = num_correct + 1
    return predict, accept_lens, accept_index


def host_tree(tokens: np.ndarray, parents: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """NGRAM's host-side `(mask, req_drafts)` pair of a batch's trees, for SGLang's grammar
    bitmask."""
    bs, width = parents.shape
    p = torch.from_numpy(parents)
    meta = tree_metadata(
        p, torch.full((bs,), width, dtype=torch.int32), torch.zeros(bs, dtype=torch.int64)
    )
    return meta.mask.reshape(-1).numpy(), tokens.reshape(-1).astype(np.int64)


def pad_to_width(result: Any, bs: int, width: int, full: int) -> None:
    """A step verified at `width` nodes per request, its accepted tokens padded in place to
    NGRAM's `full` = N per request: the stride the scheduler reads, merges and filters them
    with (and the overlap relay's)."""
    ids = result.next_token_ids.view(bs, width)
    padded = ids.new_zeros((bs, full))
    padded[:, :width] = ids
    padded = padded.flatten()
    result.next_token_ids = padded
    relay = result.next_draft_input
    result.next_draft_input = NgramVerifyInput(
        draft_token_num=full,
        new_seq_lens=relay.new_seq_lens,
        accept_tokens=padded,
        accept_lens=relay.accept_lens,
    )
