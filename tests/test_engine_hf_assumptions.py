"""What the engine relies on in transformers (checked here because versions move).

- `past_key_values=` is the cache argument, and an HF model takes a 4-D mask as is;
- `sdpa` attention takes a boolean 4-D mask (True = attend);
- `eager` attention needs an additive float mask: a boolean one gives wrong logits silently;
- `DynamicCache.crop(-k)` drops the last k positions of every layer.
"""

from __future__ import annotations

import pytest
import torch
from lookahead.hf.kv import keep_path
from tiny_models import FAMILIES, tiny_model
from transformers import DynamicCache


def _chain_mask(prefix: int, n: int) -> torch.Tensor:
    mask = torch.ones(1, 1, n, prefix + n, dtype=torch.bool)
    mask[0, 0, :, prefix:] = torch.tril(torch.ones(n, n, dtype=torch.bool))
    return mask


def _additive(mask: torch.Tensor) -> torch.Tensor:
    return torch.zeros(mask.shape).masked_fill_(~mask, torch.finfo(torch.float32).min)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_4d_mask_on_top_of_the_cache_matches_a_full_forward(family, attn):
    model = tiny_model(family, attn_implementation=attn)
    ids = torch.randint(2, 128, (1, 20), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        full = model(input_ids=ids).logits[0]
        kv = DynamicCache(config=model.config)
        model(input_ids=ids[:, :12], past_key_values=kv, use_cache=True)
        mask = _chain_mask(12, 8)
        out = model(
            input_ids=ids[:, 12:],
            position_ids=torch.arange(12, 20)[None],
            attention_mask=mask if attn == "sdpa" else _additive(mask),
            past_key_values=kv,
            use_cache=True,
        ).logits[0]
        assert kv.get_seq_length() == 20
        torch.testing.assert_close(out, full[12:], atol=1e-4, rtol=1e-4)
        if attn == "eager":
            kv.crop(-8)
            wrong = model(
                input_ids=ids[:, 12:],
                position_ids=torch.arange(12, 20)[None],
                attention_mask=mask,
                past_key_values=kv,
                use_cache=True,
            ).logits[0]
            # If this starts to hold, eager learned boolean masks; the engine's float mask
            # stays correct either way.
            assert not torch.allclose(wrong, full[12:], atol=1e-3)


def test_crop_with_a_negative_count_drops_the_tail():
    model = tiny_model("llama")
    kv = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=torch.arange(2, 12)[None], past_key_values=kv, use_cache=True)
    keys = [layer.keys.clone() for layer in kv.layers]
    kv.crop(-3)
    assert kv.get_seq_length() == 7
    for layer, k in zip(kv.layers, keys):
        torch.testing.assert_close(layer.keys, k[:, :, :7])
    kv.crop(0)  # a no-op
    assert kv.get_seq_length() == 7


def test_keep_path_moves_rows_then_crops():
    model = tiny_model("llama")
    kv = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=torch.arange(2, 14)[None], past_key_values=kv, use_cache=True)
    before = [(layer.keys.clone(), layer.values.clone()) for layer in kv.layers]
    # prefix of 5 rows, 7 draft rows; keep nodes 0, 2, 5
    with torch.inference_mode():
        keep_path(kv, 5, [0, 2, 5], 7)
    assert kv.get_seq_length() == 8
    for layer, (k, v) in zip(kv.layers, before):
        torch.testing.assert_close(layer.keys, k[:, :, [0, 1, 2, 3, 4, 5, 7, 10]])
        torch.testing.assert_close(layer.values, v[:, :, [0, 1, 2, 3, 4, 5, 7, 10]])
