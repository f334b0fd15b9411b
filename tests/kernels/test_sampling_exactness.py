"""Sampling verification is exact: the emitted tokens follow the target's sequential
distribution. A per-path (REST-style) variant is biased and the same test rejects it.

Setup: V = 4, a fixed tree whose root has children with tokens 0 and 1, a fixed target
distribution per node. The emitted sequence (accepted tokens + bonus) of a draft tree can
only be a tree path followed by a token that is not a child of the path's end, so its
exact law under the target, P(e) = prod_j p(node_{j-1})[e_j], is enumerated below; N
seeded draws are then compared with it by Pearson's chi-square test.

False-failure rate: the test fails if p < 1e-4, so an exact sampler fails for at most 1 in
10^4 seeds; the seed is fixed, so the outcome is deterministic.
"""

from __future__ import annotations

import torch
from lookahead.kernels import verify_sampling

V = 4
N = 40_000
ALPHA = 1e-4
# node: (parent, token). 0 -> {1: 0, 2: 1}; 1 -> {3: 2, 4: 3}; 2 -> {5: 0}; 3 -> {6: 1}
TREE = [(-1, 0), (0, 0), (0, 1), (1, 2), (1, 3), (2, 0), (3, 1)]
W = len(TREE)
TARGET = torch.tensor(
    [
        [0.30, 0.35, 0.20, 0.15],
        [0.10, 0.20, 0.40, 0.30],
        [0.55, 0.15, 0.20, 0.10],
        [0.25, 0.25, 0.25, 0.25],
        [0.40, 0.30, 0.20, 0.10],
        [0.10, 0.60, 0.20, 0.10],
        [0.05, 0.15, 0.30, 0.50],
    ]
)


def children(node: int) -> dict[int, int]:
    """token -> first child carrying it."""
    out: dict[int, int] = {}
    for c, (p, tok) in enumerate(TREE):
        if p == node and tok not in out:
            out[tok] = c
    return out


def exact_law() -> dict[tuple[int, ...], float]:
    law: dict[tuple[int, ...], float] = {}

    def walk(node: int, prefix: tuple[int, ...], prob: float) -> None:
        kids = children(node)
        for tok in range(V):
            p = prob * float(TARGET[node, tok])
            if tok in kids:
                walk(kids[tok], prefix + (tok,), p)
            else:
                law[prefix + (tok,)] = p

    walk(0, (), 1.0)
    return law


def batch(n: int):
    tokens = torch.tensor([t for _, t in TREE], dtype=torch.int32).expand(n, W).contiguous()
    parents = torch.tensor([p for p, _ in TREE], dtype=torch.int32).expand(n, W).contiguous()
    num_nodes = torch.full((n,), W, dtype=torch.int32)
    return tokens, parents, num_nodes, TARGET.expand(n, W, V).contiguous()


def res_nodes(res, b: int) -> list[int]:
    """The nodes whose draws row `b` used: the root and its accepted path."""
    k = int(res.num_accepted[b])
    return res.accepted_nodes[b, : k + 1].tolist()


def emitted(tokens, res) -> list[tuple[int, ...]]:
    out = []
    for b in range(tokens.shape[0]):
        k = int(res.num_accepted[b])
        path = res.accepted_nodes[b, 1 : k + 1].tolist()
        out.append(tuple(int(tokens[b, i]) for i in path) + (int(res.bonus[b]),))
    return out


def chi_square_p(samples: list[tuple[int, ...]], law: dict[tuple[int, ...], float]) -> float:
    """Pearson's test; sequences outside the law's support make p = 0."""
    counts: dict[tuple[int, ...], int] = {}
    for s in samples:
        counts[s] = counts.get(s, 0) + 1
    if any(s not in law for s in counts):
        return 0.0
    n = len(samples)
    stat = sum((counts.get(s, 0) - n * p) ** 2 / (n * p) for s, p in law.items())
    dof = len(law) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2), torch.tensor(stat / 2)))


def per_path_sampling(gen: torch.Generator, n: int) -> list[tuple[int, ...]]:
    """REST-style: verify every root-to-leaf path separately with its own draws, keep the
    longest acceptance (first path on ties). A token on several paths gets several chances."""
    leaves = [i for i in range(W) if not children(i)]
    paths = []
    for leaf in leaves:
        path, node = [], leaf
        while node != -1:
            path.append(node)
            node = TREE[node][0]
        paths.append(path[::-1])
    out = []
    for _ in range(n):
        best: tuple[int, ...] = ()
        best_len = -1
        for path in paths:
            seq: list[int] = []
            for depth, node in enumerate(path):
                tok = int(torch.multinomial(TARGET[node], 1, generator=gen))
                seq.append(tok)
                nxt = path[depth + 1] if depth + 1 < len(path) else None
                if nxt is None or TREE[nxt][1] != tok:
                    break
            if len(seq) - 1 > best_len:
                best, best_len = tuple(seq), len(seq) - 1
        out.append(best)
    return out


def test_law_is_a_distribution():
    law = exact_law()
    assert abs(sum(law.values()) - 1.0) < 1e-6
    assert len(law) == 22 and min(law.values()) * N > 20  # every cell well populated


def test_tree_verification_matches_target_distribution():
    gen = torch.Generator().manual_seed(1234)
    tokens, parents, num_nodes, probs = batch(N)
    uniforms = torch.rand(N, W, generator=gen)
    res = verify_sampling(tokens, parents, num_nodes, probs, uniforms)
    p = chi_square_p(emitted(tokens, res), exact_law())
    assert p > ALPHA, f"emitted sequences do not follow the target (chi-square p = {p:.3g})"


def test_per_path_sampling_is_rejected():
    gen = torch.Generator().manual_seed(1234)
    samples = per_path_sampling(gen, 4_000)
    p = chi_square_p(samples, exact_law())
    assert p < ALPHA, f"the biased per-path sampler was not detected (p = {p:.3g})"


def test_uniforms_drive_the_draws():
    # Same uniforms, same output; the draw at a node depends on that node's uniform only.
    gen = torch.Generator().manual_seed(5)
    tokens, parents, num_nodes, probs = batch(64)
    u = torch.rand(64, W, generator=gen)
    a = verify_sampling(tokens, parents, num_nodes, probs, u)
    b = verify_sampling(tokens, parents, num_nodes, probs, u.clone())
    assert torch.equal(a.accepted_nodes, b.accepted_nodes) and torch.equal(a.bonus, b.bonus)
    # The root's uniform picks its draw by inverse CDF over [0.30, 0.35, 0.20, 0.15]: 0.1 ->
    # token 0 (node 1 accepted), 0.99 -> token 3 (no such child: the bonus, nothing accepted).
    tokens, parents, num_nodes, probs = batch(2)
    u = torch.full((2, W), 0.5)
    u[0, 0], u[1, 0] = 0.1, 0.99
    res = emitted(tokens, verify_sampling(tokens, parents, num_nodes, probs, u))
    assert res[0][0] == 0 and res[1] == (3,)
    # Uniforms of nodes off the accepted path change nothing.
    off = [
        i
        for i in range(W)
        if i not in res_nodes(verify_sampling(tokens, parents, num_nodes, probs, u), 0)
    ]
    v = u.clone()
    v[0, off] = 0.99
    assert not torch.equal(u, v)
    assert emitted(tokens, verify_sampling(tokens, parents, num_nodes, probs, v))[0] == res[0]
