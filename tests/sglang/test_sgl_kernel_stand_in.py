"""The `sgl_kernel` stand-in (`stand_in/`): each op against SGLang's own Triton kernel of the
same contract (run by Triton's CPU interpreter in a subprocess, since the interpreter is
chosen at import), and the KV copy against a direct torch computation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("sglang", reason="needs sglang==0.5.23: requirements/sglang-test.txt")

import sgl_kernel  # noqa: E402  (the stand-in, put on sys.path by conftest)
from lookahead.kernels import tree_metadata  # noqa: E402
from sgl_kernel.speculative import reconstruct_indices_from_tree_mask  # noqa: E402


def test_the_stand_in_is_what_is_imported():
    assert getattr(sgl_kernel, "STAND_IN", False), sgl_kernel.__file__


def test_unimplemented_ops_import_but_raise_naming_the_op():
    from sgl_kernel import rmsnorm_cpu  # any name: importing must work, calling must not

    with pytest.raises(NotImplementedError, match="sgl_kernel.rmsnorm_cpu is not implemented"):
        rmsnorm_cpu(torch.zeros(1))
    with pytest.raises(AttributeError):
        sgl_kernel._private  # noqa: B018  (private names are not faked)


def random_trees(rng, bs: int, n: int) -> np.ndarray:
    """Parents [bs, n]: node 0 the root, each node's parent an earlier node."""
    parents = np.zeros((bs, n), dtype=np.int32)
    for b in range(bs):
        for i in range(1, n):
            parents[b, i] = rng.integers(0, i)
    parents[:, 0] = -1
    return parents


def ancestor_masks(parents: np.ndarray) -> np.ndarray:
    bs, n = parents.shape
    p = torch.from_numpy(parents)
    meta = tree_metadata(
        p, torch.full((bs,), n, dtype=torch.int32), torch.zeros(bs, dtype=torch.int64)
    )
    return meta.mask.numpy()


def case(seed: int) -> dict:
    """One random input for every op, as JSON for the reference subprocess."""
    rng = np.random.default_rng(seed)
    bs, n, pool_rows, pool_len = int(rng.integers(1, 6)), int(rng.integers(2, 9)), 8, 64
    req_pool_indices = rng.permutation(pool_rows)[:bs]
    req_to_token = rng.integers(0, 10_000, size=(pool_rows, pool_len))
    starts = rng.integers(0, 30, size=bs)
    ends = starts + rng.integers(0, 20, size=bs)
    steps, topk = int(rng.integers(1, 5)), int(rng.integers(1, 3))
    seq_lens = rng.integers(0, pool_len - steps * topk, size=bs)
    stride = int(rng.integers(1, 6))
    accept_lens = rng.integers(1, stride + 1, size=bs)
    accept_tokens = rng.integers(0, 1000, size=bs * stride)
    accept_index = rng.integers(0, bs * n, size=bs * stride)
    accept_index[rng.random(bs * stride) < 0.4] = -1
    out_cache_loc = rng.integers(0, 10_000, size=bs * n)
    parents = random_trees(rng, bs, n)
    masks = ancestor_masks(parents)
    vocab = 3  # small, so draft tokens often equal the target's
    candidates = rng.integers(0, vocab, size=(bs, n))
    target = rng.integers(0, vocab, size=(bs, n))
    return {
        "bs": bs,
        "n": n,
        "req_pool_indices": req_pool_indices.tolist(),
        "req_to_token": req_to_token.tolist(),
        "starts": starts.tolist(),
        "ends": ends.tolist(),
        "steps": steps,
        "topk": topk,
        "seq_lens": seq_lens.tolist(),
        "stride": stride,
        "accept_lens": accept_lens.tolist(),
        "accept_tokens": accept_tokens.tolist(),
        "accept_index": accept_index.tolist(),
        "out_cache_loc": out_cache_loc.tolist(),
        "masks": masks.reshape(-1).astype(int).tolist(),
        "candidates": candidates.tolist(),
        "target": target.tolist(),
    }


def t(x, dtype=torch.int64):
    return torch.tensor(x, dtype=dtype)


def run_ops(c: dict, ops) -> dict:
    """Every op on case `c`, with `ops` the stand-in or the Triton launchers (same calls)."""
    bs, n = c["bs"], c["n"]
    rpi, r2t = t(c["req_pool_indices"]), t(c["req_to_token"], torch.int32)
    starts, ends = t(c["starts"]), t(c["ends"])
    out = {}

    packed = torch.full((int((ends - starts).sum()) + 1,), -7, dtype=torch.int64)
    ops.assign_extend_cache_locs(rpi, r2t, starts, ends, packed)
    out["assign_extend_cache_locs"] = packed.tolist()

    pool = r2t.clone()
    ops.assign_req_to_token_pool(
        rpi, pool, starts, ends, torch.arange(10_000, 10_000 + packed.numel())
    )
    out["assign_req_to_token_pool"] = pool.tolist()

    width = c["topk"] * c["steps"]
    draft = torch.full((bs * width,), -7, dtype=torch.int64)
    ops.assign_draft_cache_locs_contiguous(rpi, r2t, t(c["seq_lens"]), draft, c["topk"], c["steps"])
    out["assign_draft_cache_locs_contiguous"] = draft.tolist()

    bonus = torch.full((bs,), -7, dtype=torch.int64)
    ops.fill_bonus_tokens(
        t(c["accept_tokens"]), t(c["accept_lens"], torch.int32), bonus, c["stride"]
    )
    out["fill_bonus_tokens"] = bonus.tolist()

    acc = torch.full((len(c["accept_index"]),), -7, dtype=torch.int64)
    ops.fill_accept_out_cache_loc(t(c["accept_index"]), t(c["out_cache_loc"]), acc)
    out["fill_accept_out_cache_loc"] = acc.tolist()

    mask = t(c["masks"], torch.bool)
    pos = torch.empty(bs * n, dtype=torch.int64)
    ri, nt, ns = (torch.empty((bs, n), dtype=torch.int64) for _ in range(3))
    ops.reconstruct(mask, t(c["seq_lens"]), pos, ri, nt, ns, bs, n)
    out["reconstruct_indices_from_tree_mask"] = [
        pos.tolist(),
        ri.tolist(),
        nt.tolist(),
        ns.tolist(),
    ]

    predicts = torch.full((bs * n,), -7, dtype=torch.int64)
    accept_index = torch.full((bs, n), -1, dtype=torch.int64)
    accept_num = torch.full((bs,), -7, dtype=torch.int64)
    ops.verify_tree_greedy(
        predicts, accept_index, accept_num, t(c["candidates"]), ri, nt, ns, t(c["target"])
    )
    out["verify_tree_greedy"] = [predicts.tolist(), accept_index.tolist(), accept_num.tolist()]
    return out


class StandIn:
    """The stand-in's ops, called as SGLang's CPU branches call them."""

    @staticmethod
    def assign_extend_cache_locs(rpi, r2t, s, e, out):
        sgl_kernel.assign_extend_cache_locs_cpu(rpi, r2t, s, e, out, r2t.shape[1])

    @staticmethod
    def assign_req_to_token_pool(rpi, r2t, s, e, locs):
        sgl_kernel.assign_req_to_token_pool_cpu(rpi, r2t, s, e, locs, r2t.shape[1])

    @staticmethod
    def assign_draft_cache_locs_contiguous(rpi, r2t, seq, out, topk, steps):
        sgl_kernel.assign_draft_cache_locs_contiguous_cpu(
            rpi, r2t, seq, out, r2t.shape[1], topk, steps
        )

    @staticmethod
    def fill_bonus_tokens(tokens, lens, bonus, stride):
        sgl_kernel.fill_bonus_tokens_cpu(tokens, lens, bonus, stride)

    @staticmethod
    def fill_accept_out_cache_loc(index, locs, out):
        sgl_kernel.fill_accept_out_cache_loc_cpu(index, locs, out)

    reconstruct = staticmethod(reconstruct_indices_from_tree_mask)

    @staticmethod
    def verify_tree_greedy(predicts, accept_index, accept_num, cand, ri, nt, ns, target):
        sgl_kernel.verify_tree_greedy_cpu(
            predicts=predicts,
            accept_index=accept_index,
            accept_token_num=accept_num,
            candidates=cand,
            retrive_index=ri,
            retrive_next_token=nt,
            retrive_next_sibling=ns,
            target_predict=target,
        )


_TRITON_OPS = r"""
import json, os, sys
sys.path.insert(0, os.environ["TEST_DIR"])
import torch
from sglang.srt.utils import next_power_of_2
from sglang.kernels.ops.speculative.cache_locs import (
    assign_draft_cache_locs_contiguous, assign_extend_cache_locs,
)
from sglang.kernels.ops.speculative.eagle import fill_accept_out_cache_loc, fill_bonus_tokens
from sglang.kernels.ops.speculative.reconstruct_tree import (
    reconstruct_indices_from_tree_mask_triton,
)
from sglang.kernels.ops.speculative.spec_tree import verify_tree_greedy_triton
from sglang.srt.mem_cache.allocation import assign_req_to_token_pool
from test_sgl_kernel_stand_in import run_ops

class Triton:
    @staticmethod
    def assign_extend_cache_locs(rpi, r2t, s, e, out):
        bs = rpi.numel()
        assign_extend_cache_locs[(bs,)](rpi, r2t, s, e, out, r2t.shape[1], next_power_of_2(bs))
    @staticmethod
    def assign_req_to_token_pool(rpi, r2t, s, e, locs):
        bs = rpi.numel()
        assign_req_to_token_pool[(bs,)](rpi, r2t, s, e, locs, r2t.shape[1], next_power_of_2(bs))
    @staticmethod
    def assign_draft_cache_locs_contiguous(rpi, r2t, seq, out, topk, steps):
        bs = rpi.numel()
        assign_draft_cache_locs_contiguous[(bs,)](rpi, r2t, seq, out, r2t.shape[1], topk, steps, BS=bs)
    @staticmethod
    def fill_bonus_tokens(tokens, lens, bonus, stride):
        fill_bonus_tokens[(lens.numel(),)](tokens, lens, bonus, stride)
    @staticmethod
    def fill_accept_out_cache_loc(index, locs, out):
        size = index.numel()
        fill_accept_out_cache_loc[(size,)](index, locs, out, next_power_of_2(size))
    reconstruct = staticmethod(reconstruct_indices_from_tree_mask_triton)
    @staticmethod
    def verify_tree_greedy(predicts, accept_index, accept_num, cand, ri, nt, ns, target):
        verify_tree_greedy_triton(predicts, accept_index, accept_num, cand, ri, nt, ns, target)

print(json.dumps([run_ops(c, Triton) for c in json.loads(sys.stdin.read())]))
"""

SEEDS = range(12)


@pytest.fixture(scope="module")
def triton_results():
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "TEST_DIR": str(Path(__file__).parent),
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent / "stand_in"), *sys.path]),
    }
    env.pop("SGLANG_USE_CPU_ENGINE", None)  # SGLang's Triton branches, not its CPU ones
    out = subprocess.run(
        [sys.executable, "-c", _TRITON_OPS],
        input=json.dumps([case(s) for s in SEEDS]),
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


OPS = [
    "assign_extend_cache_locs",
    "assign_req_to_token_pool",
    "assign_draft_cache_locs_contiguous",
    "fill_bonus_tokens",
    "fill_accept_out_cache_loc",
    "reconstruct_indices_from_tree_mask",
    "verify_tree_greedy",
]


@pytest.mark.parametrize("op", OPS)
def test_op_matches_sglangs_triton_kernel(triton_results, op):
    for seed, expect in zip(SEEDS, triton_results):
        got = run_ops(case(seed), StandIn)
        assert got[op] == expect[op], (op, seed)


def test_the_cases_exercise_acceptance():
    """Greedy verification is only tested if some cases accept drafts and some stop early."""
    accepted = [run_ops(case(s), StandIn)["verify_tree_greedy"][2] for s in SEEDS]
    flat = [a for row in accepted for a in row]
    assert max(flat) >= 2 and min(flat) == 0


def test_copy_all_layer_kv_cache_reads_every_source_before_writing():
    """Per buffer, slot tgt[j] gets what slot src[j] held before the call, also when the
    two lists overlap (a chain 1 -> 2 -> 3 and a swap 5 <-> 6)."""
    rng = np.random.default_rng(0)
    bufs = [torch.from_numpy(rng.standard_normal((10, 4, 3)).astype(np.float32)) for _ in range(3)]
    bufs.append(torch.from_numpy(rng.integers(0, 100, size=(10, 7)).astype(np.int16)))
    before = [b.clone() for b in bufs]
    src, tgt = torch.tensor([1, 2, 5, 6, 9]), torch.tensor([2, 3, 6, 5, 0])
    ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.uint64)
    strides = torch.tensor([b[0].numel() * b.element_size() for b in bufs], dtype=torch.int64)
    sgl_kernel.copy_all_layer_kv_cache_cpu(ptrs, strides, tgt, src)
    for b, old in zip(bufs, before):
        expect = old.clone()
        expect[tgt] = old[src]
        assert torch.equal(b, expect)
    sgl_kernel.copy_all_layer_kv_cache_cpu(ptrs, strides, tgt[:0], src[:0])  # nothing to move
