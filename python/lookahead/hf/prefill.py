"""The prefill: one forward over the prompt but its last token, which is the first tree's
root (its logits come from the first tree forward)."""

from __future__ import annotations

import torch

from lookahead.hf.recycling import prefill_with_rows


def prefill(model, kv, ids: list, keep_kw: dict, recycle: tuple | None = None) -> None:
    """Fill `kv` with `ids[:-1]`; `keep_kw` keeps the logits to the rows needed (the last
    alone without recycling). `recycle` = (cache, request id, k): hand the cache the top-k
    rows after the prompt's last tokens, from the same forward."""
    if len(ids) < 2:
        return
    if recycle is not None:
        cache, rid, k = recycle
        first, top_ids, top_p = prefill_with_rows(model, kv, ids[:-1], k, keep_kw)
        cache.recycle(rid, ids[first:-1], top_ids, top_p)
    else:
        device = next(model.parameters()).device
        prompt_t = torch.tensor([ids[:-1]], dtype=torch.long, device=device)
        model(input_ids=prompt_t, past_key_values=kv, use_cache=True, **keep_kw)
