"""Input checks shared by the dispatch functions; every failure is a `ValueError`.

What is checked where:
- Always (host metadata only, free on any device): types, ndim, shapes, dtypes, devices.
- Values, when `validate` is true (the default for CPU tensors, opt-in for CUDA tensors):
  `num_nodes` in [1, W]; `parents[b, 0] == -1`; for real nodes `0 <= parents[b, i] < i`;
  `seq_lens >= 0`; probabilities finite and non-negative with rows of real nodes summing to 1
  within `PROB_SUM_TOL[dtype]`; uniforms in [0, 1). Each group is a few vectorised
  reductions; on CUDA they are stacked into one small tensor and read with a single
  device-to-host copy (one sync per call, never one per node).
- Without validation (the CUDA default) the kernels stay memory-safe on bad values: they
  clamp `num_nodes` into [1, W] and treat a parent pointer outside [0, i) as "no parent".
"""

from __future__ import annotations

import torch

INDEX_DTYPES = (torch.int32, torch.int64)
PROB_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
# Row sums are computed in float32; half-precision rows carry ~V * 2^-9 of rounding.
PROB_SUM_TOL = {
    torch.float64: 1e-3,
    torch.float32: 1e-3,
    torch.float16: 1e-2,
    torch.bfloat16: 2e-2,
}


def resolve_validate(validate: bool | None, ref: torch.Tensor) -> bool:
    """`None` means: validate CPU tensors, trust CUDA tensors (no sync)."""
    return (not ref.is_cuda) if validate is None else bool(validate)


def _tensor(name: str, x: object, ndim: int, dtypes: tuple[torch.dtype, ...]) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    if x.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise ValueError(f"{name} must have dtype in ({names}), got {x.dtype}")
    return x


def _same(name: str, x: torch.Tensor, shape: tuple[int, ...], device: torch.device) -> None:
    if tuple(x.shape) != shape:
        raise ValueError(f"{name} has shape {tuple(x.shape)}, expected {shape}")
    if x.device != device:
        raise ValueError(f"{name} is on {x.device}, expected {device} (like parents)")


def _fail_first(bad: torch.Tensor, what: str) -> None:
    """Raise for the first True entry of `bad` (called only when something is wrong)."""
    where = tuple(int(v) for v in bad.nonzero()[0].tolist())
    raise ValueError(f"{what} at index {where}")


def check_tree(
    parents: object,
    num_nodes: object,
    *,
    validate: bool | None,
    tokens: object = None,
    seq_lens: object = None,
) -> bool:
    """Check a padded batch of draft trees; returns the resolved `validate` flag."""
    p = _tensor("parents", parents, 2, INDEX_DTYPES)
    B, W = p.shape
    if W < 1:
        raise ValueError("parents must have width W >= 1 (the root is node 0)")
    nn = _tensor("num_nodes", num_nodes, 1, INDEX_DTYPES)
    _same("num_nodes", nn, (B,), p.device)
    if tokens is not None:
        _same("tokens", _tensor("tokens", tokens, 2, INDEX_DTYPES), (B, W), p.device)
    lens = None
    if seq_lens is not None:
        lens = _tensor("seq_lens", seq_lens, 1, INDEX_DTYPES)
        _same("seq_lens", lens, (B,), p.device)
    do = resolve_validate(validate, p)
    if not do or B == 0:
        return do

    idx = torch.arange(W, device=p.device)
    n = nn.long()
    par = p.long()
    draft = (idx >= 1) & (idx[None, :] < n[:, None])  # real nodes other than the root
    bad_n = (n < 1) | (n > W)
    bad_root = par[:, 0] != -1
    bad_par = draft & ((par < 0) | (par >= idx))
    checks = [bad_n.any(), bad_root.any(), bad_par.any()]
    bad_len = None
    if lens is not None:
        bad_len = lens < 0
        checks.append(bad_len.any())
    flags = torch.stack(checks).cpu().tolist()  # the one device-to-host copy
    if flags[0]:
        _fail_first(bad_n, f"num_nodes must be in [1, W={W}]; got {nn[bad_n][0].item()}")
    if flags[1]:
        _fail_first(bad_root, "parents[b, 0] must be -1 (node 0 is the root)")
    if flags[2]:
        _fail_first(bad_par, "parents must point to an earlier node (0 <= parents[b, i] < i)")
    if bad_len is not None and flags[3]:
        _fail_first(bad_len, "seq_lens must be >= 0")
    return do


def check_target_tokens(target_tokens: object, parents: torch.Tensor) -> None:
    """`target_tokens` int [B, W] on the same device as `parents`."""
    t = _tensor("target_tokens", target_tokens, 2, INDEX_DTYPES)
    _same("target_tokens", t, tuple(parents.shape), parents.device)


def check_probs(
    probs: object,
    uniforms: object,
    parents: torch.Tensor,
    num_nodes: torch.Tensor,
    *,
    validate: bool,
) -> None:
    """`probs` float [B, W, V] and `uniforms` float [B, W]; values when `validate`."""
    B, W = parents.shape
    pr = _tensor("probs", probs, 3, PROB_DTYPES)
    if tuple(pr.shape[:2]) != (B, W) or pr.shape[2] < 1:
        raise ValueError(f"probs has shape {tuple(pr.shape)}, expected ({B}, {W}, V >= 1)")
    if pr.device != parents.device:
        raise ValueError(f"probs is on {pr.device}, expected {parents.device} (like parents)")
    un = _tensor("uniforms", uniforms, 2, PROB_DTYPES)
    _same("uniforms", un, (B, W), parents.device)
    if not validate or B == 0:
        return

    real = torch.arange(W, device=pr.device)[None, :] < num_nodes[:, None].long()
    row_sum = pr.sum(dim=-1, dtype=torch.float32)
    row_min = pr.amin(dim=-1)
    tol = PROB_SUM_TOL[pr.dtype]
    not_finite = real & ~torch.isfinite(row_sum)  # NaN and inf propagate into the sum
    negative = real & ~(row_min >= 0)
    off_sum = real & torch.isfinite(row_sum) & ((row_sum - 1.0).abs() > tol)
    bad_u = ~((un >= 0) & (un < 1))
    checks = [not_finite.any(), negative.any(), off_sum.any(), bad_u.any()]
    flags = torch.stack(checks).cpu().tolist()  # the one device-to-host copy
    if flags[0]:
        _fail_first(not_finite, "probs must be finite (NaN or inf in the row of node)")
    if flags[1]:
        _fail_first(negative, "probs must be non-negative (negative value in the row of node)")
    if flags[2]:
        b, i = (int(v) for v in off_sum.nonzero()[0].tolist())
        raise ValueError(
            f"probs rows must sum to 1 within {tol} (after temperature/top-k/top-p; pass "
            f"probabilities, not logits); row of node {(b, i)} sums to {row_sum[b, i].item():.6g}"
        )
    if flags[3]:
        _fail_first(bad_u, "uniforms must be in [0, 1)")
