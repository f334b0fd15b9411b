"""Why an output differs from plain greedy decoding: a rounding near-tie, or a bug.

In bf16 (or fp16) a forward over several rows rounds differently from a one-row forward, so
greedy decoding with drafts can pick another token where the model's top two logits are
nearly tied. `explain_fork` finds the first differing position, re-scores both tokens there
with the plain path's own one-row forward over the shared prefix, and calls the fork a
near-tie when their logit margin is within `rounding_bound`: twice the largest change of a
competing logit (one within `COMPETITOR_GAP` of the row's best) between one-row and
multi-row forwards of the same prefix, measured on this model, dtype and device. A fork
outside that bound cannot come from rounding: it is a bug.
"""

from __future__ import annotations

from dataclasses import dataclass

# Logits this far below a row's best are not competitors for the argmax.
COMPETITOR_GAP = 5.0


@dataclass(frozen=True)
class Fork:
    """The first position where two greedy outputs differ, scored by the plain path."""

    position: int  # index into the new tokens
    plain_token: int | None  # None: that output ended first
    other_token: int | None
    margin: float  # plain's logit minus the other's, one-row forward (nan when one ended)
    bound: float
    near_tie: bool

    def describe(self) -> str:
        """`fork @87, near-tie, margin 0.03` (or `..., BUG, margin 4.1 > bound 0.25`)."""
        if self.plain_token is None or self.other_token is None:
            # Both stop at the same eos and length: one ending first is no rounding fork.
            return f"fork @{self.position}, BUG, one output ended first"
        if self.near_tie:
            return f"fork @{self.position}, near-tie, margin {abs(self.margin):.3g}"
        return f"fork @{self.position}, BUG, margin {self.margin:.3g} > bound {self.bound:.3g}"


def first_difference(a, b) -> int:
    """The first position where token lists `a` and `b` differ; where one is the other's
    start (or they are equal), the shorter one's length."""
    n = min(len(a), len(b))
    return next((k for k in range(n) if a[k] != b[k]), n)


def _one_by_one(model, ids: list, start: int):
    """Logits at positions start-1 .. len-1: prefill `ids[:start]`, then one-row forwards."""
    import torch

    with torch.inference_mode():
        x = torch.tensor([ids], device=model.device)
        out = model(input_ids=x[:, :start], use_cache=True)
        rows, pkv = [out.logits[0, -1].float()], out.past_key_values
        for i in range(start, len(ids)):
            out = model(input_ids=x[:, i : i + 1], past_key_values=pkv, use_cache=True)
            rows.append(out.logits[0, -1].float())
            pkv = out.past_key_values
    return torch.stack(rows)


def _at_once(model, ids: list, start: int):
    """The same positions' logits with `ids[start:]` in one multi-row forward."""
    import torch

    with torch.inference_mode():
        x = torch.tensor([ids], device=model.device)
        out = model(input_ids=x[:, :start], use_cache=True)
        first = out.logits[0, -1:].float()
        rest = model(input_ids=x[:, start:], past_key_values=out.past_key_values, use_cache=True)
    return torch.cat([first, rest.logits[0].float()])


def rounding_bound(model, ids: list, rows: int = 16) -> float:
    """How far rounding can move a logit margin on this model, dtype and device: twice the
    largest difference of a competing logit between one-row forwards and one forward of
    `rows` rows, over the last `rows` positions of `ids` (at least 2 tokens)."""
    if len(ids) < 2:
        raise ValueError("rounding_bound needs at least 2 token ids")
    start = max(1, len(ids) - rows)
    a, b = _one_by_one(model, ids, start), _at_once(model, ids, start)
    competing = a >= a.max(dim=-1, keepdim=True).values - COMPETITOR_GAP
    return 2.0 * float((a - b).abs()[competing].max())


def explain_fork(model, prompt_ids: list, plain_ids: list, other_ids: list, bound: float):
    """None if the two outputs are equal, else the `Fork` at their first difference, with
    both tokens scored by a one-row forward over the prompt and the shared tokens."""
    import torch

    plain_ids, other_ids = list(plain_ids), list(other_ids)
    if plain_ids == other_ids:
        return None
    n = min(len(plain_ids), len(other_ids))
    i = first_difference(plain_ids, other_ids)
    if i == n:  # one is a prefix of the other: it stopped (eos, stop string, length)
        a = plain_ids[i] if i < len(plain_ids) else None
        b = other_ids[i] if i < len(other_ids) else None
        return Fork(i, a, b, float("nan"), bound, False)
    prefix = list(prompt_ids) + plain_ids[:i]
    with torch.inference_mode():
        x = torch.tensor([prefix], device=model.device)
        if len(prefix) > 1:
            pkv = model(input_ids=x[:, :-1], use_cache=True).past_key_values
            logits = model(input_ids=x[:, -1:], past_key_values=pkv, use_cache=True).logits
        else:
            logits = model(input_ids=x).logits
    row = logits[0, -1].float()
    a, b = plain_ids[i], other_ids[i]
    margin = float(row[a] - row[b])
    return Fork(i, a, b, margin, bound, abs(margin) <= bound)
