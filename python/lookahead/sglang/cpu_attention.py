"""A tree-capable attention backend for SGLang's CPU engine without Intel AMX.

On `--device cpu` SGLang 0.5.23 picks `intel_amx`, and falls back to `torch_native` where
the CPU has no AMX (`_attention_backend_platform_fallbacks`). `torch_native` has no
TARGET_VERIFY branch: a verify forward reaches its extend path, which reads extend lengths
a verify batch does not carry, and fails (NGRAM crashes the scheduler there too). This
backend is `torch_native` plus that branch: each request's N draft rows attend to its
verified prefix and, through the draft tree's ancestor mask (NGRAM's `[bs, N, N]` QLEN
layout, which LOOKAHEAD and NGRAM both build on CPU), to their own ancestors. Prefill and
decode are `torch_native`'s, unchanged. It is torch SDPA per request, correct rather than
fast, as `torch_native` is.

The plugin registers it under `TREE_SDPA_BACKEND` in every SGLang process and selects it
for LOOKAHEAD on CPU where SGLang resolved `torch_native`; any algorithm can ask for it with
`--attention-backend lookahead_tree_sdpa` (the CPU serving benchmark runs NGRAM so).
Sliding-window and cross-attention layers are refused in a verify forward.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.functional import scaled_dot_product_attention

__all__ = ["TREE_SDPA_BACKEND", "register_backend", "tree_verify_attention"]

TREE_SDPA_BACKEND = "lookahead_tree_sdpa"

_registered = False


def tree_verify_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    tree_mask: torch.Tensor,
    width: int,
    scaling: float | None,
    enable_gqa: bool,
) -> torch.Tensor:
    """Attention of B draft trees of `width` nodes each, their KV already in the cache.

    `query` [B * width, heads, dim]; `seq_lens` [B] verified lengths (the draft's KV sits at
    `req_to_token[r, seq_len : seq_len + width]`); `tree_mask` B * width * width bools,
    row i of request b marking node i's ancestors and itself. Returns [B * width, heads, dv].
    """
    bs = seq_lens.shape[0]
    if query.shape[0] != bs * width:
        raise ValueError(f"verify query has {query.shape[0]} rows, expected {bs} x {width}")
    if tree_mask.numel() != bs * width * width:
        raise ValueError(
            f"tree mask has {tree_mask.numel()} entries, expected {bs} x {width} x {width} "
            "(the QLEN layout; a full prefix+tree mask is a CUDA-backend layout)"
        )
    masks = tree_mask.reshape(bs, width, width).to(torch.bool)
    out = query.new_empty(query.shape[0], query.shape[1], v_cache.shape[-1])
    rows = req_pool_indices.tolist()
    for b, (row, n) in enumerate(zip(rows, seq_lens.tolist())):
        slots = req_to_token[row, : n + width]
        q = query[b * width : (b + 1) * width].movedim(0, 1)  # [heads, width, dim]
        k = k_cache[slots].movedim(0, 1).to(q.dtype)
        v = v_cache[slots].movedim(0, 1).to(q.dtype)
        mask = torch.ones(width, n + width, dtype=torch.bool)
        mask[:, n:] = masks[b]
        o = scaled_dot_product_attention(
            q.unsqueeze(0),
            k.unsqueeze(0),
            v.unsqueeze(0),
            attn_mask=mask,
            scale=scaling,
            enable_gqa=enable_gqa,
        )
        out[b * width : (b + 1) * width] = o.squeeze(0).movedim(0, 1)
    return out


def _backend_class() -> type:
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    class TreeSDPAAttnBackend(TorchNativeAttnBackend):
        """`torch_native` with a TARGET_VERIFY branch that applies the draft-tree mask."""

        def forward_extend(
            self,
            q: torch.Tensor,
            k: torch.Tensor,
            v: torch.Tensor,
            layer: Any,
            forward_batch: Any,
            save_kv_cache: bool = True,
        ) -> torch.Tensor:
            if not forward_batch.forward_mode.is_target_verify():
                return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache)
            if layer.is_cross_attention or (
                layer.sliding_window_size is not None and layer.sliding_window_size > -1
            ):
                raise NotImplementedError(
                    f"{TREE_SDPA_BACKEND}: verify forwards of sliding-window or cross-"
                    "attention layers are not supported"
                )
            if save_kv_cache and k is not None and v is not None:
                self.token_to_kv_pool.set_kv_buffer(
                    layer, KVWriteLoc(forward_batch.out_cache_loc, self.swa_out_cache_loc), k, v
                )
            spec = forward_batch.spec_info
            o = tree_verify_attention(
                q.view(-1, layer.tp_q_head_num, layer.qk_head_dim),
                self.token_to_kv_pool.get_key_buffer(layer.layer_id),
                self.token_to_kv_pool.get_value_buffer(layer.layer_id),
                self.req_to_token_pool.req_to_token,
                forward_batch.req_pool_indices,
                forward_batch.seq_lens,
                spec.custom_mask,
                spec.draft_token_num,
                layer.scaling,
                layer.tp_q_head_num != layer.tp_k_head_num,
            )
            return o.reshape(q.shape[0], layer.tp_q_head_num * layer.v_head_dim)

    return TreeSDPAAttnBackend


def register_backend() -> None:
    """Makes `--attention-backend lookahead_tree_sdpa` known to SGLang (once per process)."""
    global _registered
    if _registered:
        return
    from sglang.srt.arg_groups.choices import (
        ATTENTION_BACKEND_CHOICES,
        add_attention_backend_choices,
    )
    from sglang.srt.layers.attention.attention_registry import register_attention_backend

    if TREE_SDPA_BACKEND not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([TREE_SDPA_BACKEND])

    @register_attention_backend(TREE_SDPA_BACKEND)
    def _create(runner: Any) -> Any:
        return _backend_class()(runner)

    _registered = True
