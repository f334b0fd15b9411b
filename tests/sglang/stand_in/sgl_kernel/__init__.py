"""A stand-in for `sgl_kernel`'s CPU ops, in plain torch, for SGLang 0.5.23's CPU engine here.

What it replaces and why: SGLang's CPU engine (`--device cpu`, `SGLANG_USE_CPU_ENGINE=1`)
imports `sgl_kernel` at module level and calls its `*_cpu` ops for KV-cache moves, cache
locations and speculative verification. Those ops are C++ built for Intel Xeon CPUs
(`sgl-kernel`'s CPU build, not on PyPI); the wheel on PyPI is CUDA-only and its import loads
`libnvrtc`. This machine has neither, so the tests put this folder on the server's
`PYTHONPATH` (and on `sys.path` for in-process tests).

Every op below computes for real, with the contract of SGLang's own Triton kernel of the
same name (`sglang/kernels/ops/...`, cited per op), and has a unit test against a direct
computation (`tests/sglang/test_sgl_kernel_stand_in.py`). Any other name imported from this
package is a placeholder that raises `NotImplementedError` naming the op when called, so a
code path nobody implemented here fails loudly instead of computing something wrong; module
imports of SGLang that merely name such ops (at import time, for other platforms) succeed.
"""

from __future__ import annotations

import ctypes

import numpy as np
import torch

__all__ = [
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "copy_all_layer_kv_cache_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "verify_tree_greedy_cpu",
]

STAND_IN = True  # lets tests and logs tell this package from a real sgl_kernel


def _not_implemented(qualname: str):
    def op(*args, **kwargs):
        raise NotImplementedError(
            f"{qualname} is not implemented by the test stand-in of sgl_kernel "
            "(tests/sglang/stand_in); SGLang reached an op this CPU run did not expect"
        )

    op.__name__ = qualname.rsplit(".", 1)[-1]
    op.__qualname__ = qualname
    return op


def placeholder_getattr(module_name: str):
    """A module `__getattr__` that answers unknown public names with a raising op."""

    def __getattr__(name: str):
        if name.startswith("_"):
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        return _not_implemented(f"{module_name}.{name}")

    return __getattr__


__getattr__ = placeholder_getattr("sgl_kernel")


def _packed_spans(
    req_pool_indices: torch.Tensor, start: torch.Tensor, end: torch.Tensor
) -> list[tuple[int, int, int, int]]:
    """(pool row, start, end, offset into the packed list) per request, the offset computed
    as the Triton kernels compute it: the sum of the earlier requests' lengths."""
    out, offset = [], 0
    for row, s, e in zip(req_pool_indices.tolist(), start.tolist(), end.tolist()):
        out.append((row, s, e, offset))
        offset += e - s
    return out


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Packs `req_to_token[req, start:end]` of every request into `out_cache_loc`, one
    after the other (`kernels/ops/speculative/cache_locs.py: assign_extend_cache_locs`)."""
    for row, s, e, off in _packed_spans(req_pool_indices, start_offset, end_offset):
        out_cache_loc[off : off + e - s] = req_to_token[row, s:e].to(out_cache_loc.dtype)


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """The inverse of `assign_extend_cache_locs_cpu`: writes the packed `out_cache_loc`
    into `req_to_token[req, start:end]` (`mem_cache/allocation.py:
    assign_req_to_token_pool`)."""
    for row, s, e, off in _packed_spans(req_pool_indices, start_offset, end_offset):
        req_to_token[row, s:e] = out_cache_loc[off : off + e - s].to(req_to_token.dtype)


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
    topk: int,
    speculative_num_steps: int,
) -> None:
    """Copies each request's `topk * steps` slots from `seq_lens` on into its block of
    `out_cache_loc` (`cache_locs.py: assign_draft_cache_locs_contiguous`)."""
    width = topk * speculative_num_steps
    for i, (row, n) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        out_cache_loc[i * width : (i + 1) * width] = req_to_token[row, n : n + width].to(
            out_cache_loc.dtype
        )


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor,
    accept_lens: torch.Tensor,
    bonus_tokens: torch.Tensor,
    accept_stride: int,
) -> None:
    """`bonus_tokens[i]` = the last accepted token of request i (the accept length counts
    the bonus token) (`kernels/ops/speculative/eagle.py: fill_bonus_tokens`)."""
    flat = accept_tokens.reshape(-1)
    idx = torch.arange(accept_lens.numel(), dtype=torch.int64) * accept_stride
    idx = idx + accept_lens.to(torch.int64) - 1
    bonus_tokens.copy_(flat[idx].to(bonus_tokens.dtype))


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor,
    out_cache_loc: torch.Tensor,
    accept_out_cache_loc: torch.Tensor,
) -> None:
    """Compacts `out_cache_loc[accept_index]` over the entries that are not -1, in order
    (`eagle.py: fill_accept_out_cache_loc`)."""
    flat = accept_index.reshape(-1).to(torch.int64)
    kept = flat[flat != -1]
    accept_out_cache_loc[: kept.numel()] = out_cache_loc[kept].to(accept_out_cache_loc.dtype)


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor,
    strides: torch.Tensor,
    tgt_loc: torch.Tensor,
    src_loc: torch.Tensor,
) -> None:
    """For every KV buffer (raw address `data_ptrs[b]`, `strides[b]` bytes per token
    slot), copies slot `src_loc[j]` to slot `tgt_loc[j]` for all j; all sources are read
    before any target is written, so it is safe in place
    (`kernels/ops/kvcache/cache_move.py: copy_all_layer_kv_cache_tiled`)."""
    if tgt_loc.numel() == 0:
        return
    src = src_loc.to(torch.int64).numpy()
    tgt = tgt_loc.to(torch.int64).numpy()
    rows = int(max(src.max(), tgt.max())) + 1
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist()):
        raw = (ctypes.c_uint8 * (rows * stride)).from_address(ptr)
        buf = np.frombuffer(raw, dtype=np.uint8).reshape(rows, stride)
        buf[tgt] = buf[src]  # numpy gathers the right side before it scatters


def verify_tree_greedy_cpu(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Greedy tree verification: from the root, follow the child whose draft token equals
    the target's argmax at the last accepted node, as deep as it goes
    (`kernels/ops/speculative/spec_tree.py: verify_tree_greedy_kernel_triton`).

    Writes `predicts[node]` (the target's token at each accepted node and at the last),
    `accept_index[b, :1 + accepted]` (flat node indices) and `accept_token_num[b]`."""
    bs, n = candidates.shape
    steps = accept_index.shape[1]
    cand = candidates.tolist()
    r_index = retrive_index.tolist()
    r_next = retrive_next_token.tolist()
    r_sib = retrive_next_sibling.tolist()
    target = target_predict.reshape(-1).tolist()
    for b in range(bs):
        last = r_index[b][0]
        accept_index[b, 0] = last
        accepted = 0
        cur = 0
        for _ in range(1, steps):
            cur = r_next[b][cur]
            want = target[last]
            while cur != -1 and cand[b][cur] != want:
                cur = r_sib[b][cur]
            if cur == -1:
                break
            predicts[last] = want
            accepted += 1
            last = r_index[b][cur]
            accept_index[b, accepted] = last
        accept_token_num[b] = accepted
        predicts[last] = target[last]
