"""Acceptance: which of the tree's draft tokens the target takes (greedy: its argmax;
sampling: exact speculative sampling with a seeded stream of uniforms)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lookahead import kernels
from lookahead.hf.sampling import SamplingConfig, node_scores
from lookahead.hf.tree_inputs import Tree

# Uniforms drawn at a time for sampling (a fixed size: the stream depends on the seed only).
UNIFORM_CHUNK = 256


class Uniforms:
    """The seeded stream of uniforms exact sampling draws from: uniform `i` serves output
    position `i` (a walk visits one node per depth), drawn `UNIFORM_CHUNK` at a time so the
    stream is a function of the seed alone; `seed` None draws a fresh seed for this stream
    only, not torch's global one."""

    def __init__(self, seed: int | None):
        self.gen = torch.Generator(device="cpu")
        if seed is None:
            self.gen.seed()
        else:
            self.gen.manual_seed(seed)
        self._drawn = torch.empty(0)

    def at(self, positions: torch.Tensor) -> torch.Tensor:
        """The uniforms of these output positions."""
        need = int(positions.max()) + 1 if positions.numel() else 0
        while self._drawn.numel() < need:
            more = torch.rand(UNIFORM_CHUNK, generator=self.gen)
            self._drawn = torch.cat([self._drawn, more])
        return self._drawn[positions]


@dataclass
class Verdict:
    """One verified step: the accepted path (node indices from the root), the tokens it
    emits (accepted drafts + the bonus), and the logits and probabilities it was read from."""

    path: list
    emitted: list
    scores: torch.Tensor  # processed logits [n, V] on the model's device
    probs: torch.Tensor | None  # their softmax on the host, when sampling

    @property
    def accepted(self) -> int:
        """Draft tokens accepted (the bonus not counted)."""
        return len(self.path) - 1


class Acceptance:
    """Verifies each step's tree for one request with `cfg`'s sampling settings."""

    def __init__(self, cfg: SamplingConfig, seed: int | None, model, prompt_ids: list, device):
        self.cfg = cfg
        self.seen = None  # the ids so far, for the repetition penalty
        if cfg.repetition_penalty != 1.0:
            # One entry per logit: an output head padded past config.vocab_size has more.
            head = model.get_output_embeddings()
            rows = head.weight.shape[0] if head is not None else model.config.vocab_size
            self.seen = torch.zeros(rows, dtype=torch.bool, device=device)
            self.seen[torch.tensor(prompt_ids, device=device)] = True
        self.device = device
        self.uniforms = Uniforms(seed) if cfg.do_sample else None

    def verify(self, logits: torch.Tensor, tree: Tree, emitted_so_far: int) -> Verdict:
        """The verdict on `tree` from the forward's `logits` [n, V], the output holding
        `emitted_so_far` tokens before this step."""
        cfg, n = self.cfg, tree.n
        if cfg.needs_processing:
            scores = node_scores(logits, cfg, self.seen, tree.tokens[0], tree.meta.mask[0])
        else:
            scores = logits
        probs = None
        if cfg.do_sample:
            probs = scores.softmax(dim=-1).cpu()
            at = emitted_so_far + tree.meta.positions[0, :n].cpu() - tree.seq_len
            res = kernels.verify_sampling(
                tree.tokens, tree.parents, tree.num_nodes, probs[None], self.uniforms.at(at)[None]
            )
        else:
            target = scores.argmax(dim=-1).cpu()
            res = kernels.verify_greedy(tree.tokens, tree.parents, tree.num_nodes, target[None])
        n_acc = int(res.num_accepted[0])
        path = res.accepted_nodes[0, : n_acc + 1].tolist()
        emitted = tree.tokens[0, path[1:]].tolist() + [int(res.bonus[0])]
        return Verdict(path, emitted, scores, probs)

    def emitted(self, ids: list) -> None:
        """Note the step's emitted ids (the repetition penalty counts them from now on)."""
        if self.seen is not None:
            self.seen[torch.tensor(ids, device=self.device)] = True
