"""KV-cache handling for tree verification on top of an HF `DynamicCache`.

After the forward over the `W` draft nodes, the cache holds `seq_len + W` rows per layer: the
verified prefix, then one row per draft node in node order. Only the accepted path survives:
its rows move to the positions right after the prefix, and the rest is cropped.
"""

from __future__ import annotations

import inspect

import torch

from lookahead.errors import KVCacheError


def check_model_supports_kv(model) -> None:
    """Raise `KVCacheError` unless `model` is an HF causal LM whose forward takes a KV cache."""
    forward = getattr(model, "forward", None)
    config = getattr(model, "config", None)
    if forward is None or config is None:
        raise KVCacheError(
            f"{type(model).__name__} is not an HF transformers model (no forward/config)"
        )
    params = inspect.signature(forward).parameters
    missing = [p for p in ("past_key_values", "position_ids", "attention_mask") if p not in params]
    if missing:
        raise KVCacheError(
            f"{type(model).__name__}.forward takes no {', '.join(missing)}: lookahead needs a "
            "causal LM with an HF KV cache (past_key_values), explicit positions and a 4-D mask"
        )
    if getattr(config, "is_encoder_decoder", False):
        raise KVCacheError("encoder-decoder models are not supported; use a decoder-only LM")


def last_logits_only(model) -> dict:
    """Keyword arguments that make a forward compute the last position's logits alone (a
    prefill needs no others), where the model's forward names the option; else none
    (remote-code models may lack it)."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return {}
    return {"logits_to_keep": 1} if "logits_to_keep" in params else {}


def new_cache(model):
    """A fresh `DynamicCache` for `model`."""
    from transformers import DynamicCache

    try:
        return DynamicCache(config=model.config)
    except TypeError:  # older signatures take no config
        return DynamicCache()


def check_cache_layers(cache, max_total_len: int) -> None:
    """Refuse caches whose layers would drop rows the engine later moves (sliding windows)."""
    for layer in getattr(cache, "layers", ()):
        window = getattr(layer, "sliding_window", None)
        if getattr(layer, "is_sliding", False) and window is not None and max_total_len >= window:
            raise KVCacheError(
                f"the model uses a sliding-window KV cache (window {window}) and this request "
                f"may reach {max_total_len} positions; lookahead's KV fix-up needs every row kept"
            )


def keep_path(cache, seq_len: int, path: list[int], num_new: int) -> None:
    """Keep the KV rows of `path` (draft node indices, root first) and drop the other nodes.

    Row `seq_len + path[k]` moves to `seq_len + k`; the cache ends at `seq_len + len(path)`.
    Paths are increasing (parents precede children), so rows only move towards the prefix.
    """
    first = next((k for k, node in enumerate(path) if node != k), None)
    if first is not None:
        src = torch.tensor([seq_len + node for node in path[first:]], dtype=torch.long)
        lo, hi = seq_len + first, seq_len + len(path)
        for layer in cache.layers:
            # index_select copies first, so overlapping source and destination rows are safe.
            layer.keys[:, :, lo:hi] = layer.keys.index_select(2, src.to(layer.keys.device))
            layer.values[:, :, lo:hi] = layer.values.index_select(2, src.to(layer.values.device))
    drop = num_new - len(path)
    if drop > 0:
        cache.crop(-drop)
