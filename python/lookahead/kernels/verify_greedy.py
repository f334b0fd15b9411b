"""Greedy tree verification: the longest root path the target model agrees with.

Walk from the root: at node `n`, accept the first child `c` (lowest index) whose draft token
equals the target's choice at `n`; stop when there is none. The bonus token is the target's
choice at the last accepted node. Sampling verification (`verify_sampling.py`) is the same
walk with the target's choice at each node drawn from its distribution, so both use the
walk kernel below.

Duplicate sibling tokens: only the lowest-index one can be accepted (a well-formed trie
never has them; the rule makes the result deterministic if one does).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from lookahead.kernels._jit import check_launchable, lazy_jit, next_pow2
from lookahead.kernels._types import VerifyResult

tl: Any = None  # bound to triton.language on the first launch (see _jit.py)


@lazy_jit
def _tree_walk_kernel(
    tokens_ptr,
    parents_ptr,
    num_nodes_ptr,
    choice_ptr,
    accepted_ptr,
    num_accepted_ptr,
    bonus_ptr,
    W,
    BLOCK_W: tl.constexpr,
):
    b = tl.program_id(0)
    idx = tl.arange(0, BLOCK_W)
    n = tl.minimum(tl.maximum(tl.load(num_nodes_ptr + b), 1), W).to(tl.int32)  # clamp, then narrow
    base = b.to(tl.int64) * W
    draft = (idx >= 1) & (idx < n)
    tok = tl.load(tokens_ptr + base + idx, mask=draft, other=0).to(tl.int64)
    par = tl.load(parents_ptr + base + idx, mask=draft, other=-1)
    par = tl.where(draft & (par >= 0) & (par < idx), par, -1).to(tl.int32)

    path = tl.where(idx == 0, 0, -1)
    cur = tl.zeros([], dtype=tl.int32)
    going = cur == 0
    for step in range(1, W):
        want = tl.load(choice_ptr + base + cur).to(tl.int64)
        cand = (par == cur) & (tok == want)
        nxt = tl.min(tl.where(cand, idx, BLOCK_W), axis=0)
        going = going & (nxt < BLOCK_W)
        path = tl.where((idx == step) & going, nxt, path)
        cur = tl.where(going, nxt, cur)

    tl.store(accepted_ptr + base + idx, path, mask=idx < W)
    tl.store(num_accepted_ptr + b, tl.sum((path >= 1).to(tl.int32), axis=0))
    tl.store(bonus_ptr + b, tl.load(choice_ptr + base + cur).to(tl.int64))


def tree_walk_triton(
    tokens: torch.Tensor, parents: torch.Tensor, num_nodes: torch.Tensor, choice: torch.Tensor
) -> VerifyResult:
    """Launch the walk with the target's per-node choice `choice [B, W]` (int32 or int64)."""
    check_launchable(tokens, parents, num_nodes, choice)
    B, W = tokens.shape
    dev = tokens.device
    out = VerifyResult(
        accepted_nodes=torch.empty((B, W), dtype=torch.int32, device=dev),
        num_accepted=torch.empty((B,), dtype=torch.int32, device=dev),
        bonus=torch.empty((B,), dtype=torch.int64, device=dev),
    )
    if B == 0:
        return out
    _tree_walk_kernel[(B,)](
        tokens.contiguous(),
        parents.contiguous(),
        num_nodes.contiguous(),
        choice.contiguous(),
        out.accepted_nodes,
        out.num_accepted,
        out.bonus,
        W,
        BLOCK_W=next_pow2(W),
        num_warps=1,
    )
    return out


def verify_greedy_triton(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    num_nodes: torch.Tensor,
    target_tokens: torch.Tensor,
) -> VerifyResult:
    """Triton launcher of `verify_greedy` (inputs already checked)."""
    return tree_walk_triton(tokens, parents, num_nodes, target_tokens)


def tree_walk_ref(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    num_nodes: torch.Tensor,
    choose: Callable[[torch.Tensor], torch.Tensor],
) -> VerifyResult:
    """The walk shared by both verifications; `choose(cur)` gives the target's token at
    node `cur[b]` of every request (int64 [B]) and is called once per visited level."""
    B, W = tokens.shape
    dev = tokens.device
    idx = torch.arange(W, device=dev)
    draft = (idx >= 1) & (idx[None, :] < num_nodes.long().clamp(1, W)[:, None])
    par = parents.long()
    par = torch.where(draft & (par >= 0) & (par < idx), par, -1)
    tok = tokens.long()

    accepted = torch.full((B, W), -1, dtype=torch.int32, device=dev)
    accepted[:, 0] = 0
    cur = torch.zeros(B, dtype=torch.long, device=dev)
    going = torch.ones(B, dtype=torch.bool, device=dev)
    bonus = torch.zeros(B, dtype=torch.long, device=dev)
    on_cpu = dev.type == "cpu"
    for step in range(1, W):
        want = choose(cur)
        nxt = torch.where((par == cur[:, None]) & (tok == want[:, None]), idx, W).amin(dim=1)
        bonus = torch.where(going & (nxt == W), want, bonus)
        going = going & (nxt < W)
        accepted[:, step] = torch.where(going, nxt, -1).to(torch.int32)
        cur = torch.where(going, nxt, cur)
        # On CPU stop once every walk has ended; elsewhere run all levels without a sync.
        if on_cpu and not bool(going.any()):
            break
    if not on_cpu or bool(going.any()):
        # Walks that used up the whole width: the bonus is the choice at their last node.
        bonus = torch.where(going, choose(cur), bonus)
    num_accepted = (accepted >= 1).sum(dim=1, dtype=torch.int32)
    return VerifyResult(accepted_nodes=accepted, num_accepted=num_accepted, bonus=bonus)


def verify_greedy_ref(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    num_nodes: torch.Tensor,
    target_tokens: torch.Tensor,
) -> VerifyResult:
    """Torch reference of `verify_greedy`.

    With `t(n) = target_tokens[b, n]` (the target's argmax after node n's prefix):
      path_0 = 0 (the root);  path_{k+1} = min{c : parent(c) == path_k, tokens[c] == t(path_k)}
      while that set is non-empty; accepted_nodes = path, num_accepted = len(path) - 1,
      bonus = t(path_last).
    """
    target = target_tokens.long()
    rows = torch.arange(tokens.shape[0], device=tokens.device)
    return tree_walk_ref(tokens, parents, num_nodes, lambda cur: target[rows, cur])
