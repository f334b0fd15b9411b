"""An obviously correct pure-Python model of `LookaheadCache` drafting (no eviction).

It stores, per trie, `children[p][t]`: how often the n-gram `p + (t,)` occurs in the indexed
text, and recomputes everything by brute force. It follows the documented rules of
rust/README.md ("Drafting") literally:

- a request's own trie: every n-gram (up to `max_depth` tokens) of its prompt, and those
  ending at each token passed to `extend` for it;
- namespace history: for every token passed to `extend` (and every prompt merged on finish,
  and every `add_history` text), the n-grams ending at that token;
- candidates: a trie whose n-gram has more than TOP_K continuations offers only its TOP_K
  best (count desc, token asc), the other trie its own (or its TOP_K best); each offered token
  is scored with both tries' counts;
- match: the longest suffix (<= max_depth - 1 tokens) of the context with a continuation in a
  participating trie (weight > 0), scanning lengths from longest to shortest; the history
  takes part only at lengths outside `history_skip` (lo..=hi), but a state keeps following
  it (a node's history flag: its n-gram has a continuation there), so deeper it answers again;
- score(t) = (w_p * c_P/(S_P + D_P) + w_o * c_H/(S_H + D_H)) / (w_p + w_o) over the tries
  still tracked (S: sum of the continuations' counts, D: their number);
- backoff, at the root only: after the candidates of the matched n-gram p come those of p's
  shorter suffixes (longest first), tokens continuing a longer one (offered or not)
  excluded, scaled by the escape mass left (product of 1 - sum of scores over the longer
  levels), while that mass >= BACKOFF_MIN_MASS,
  at most BACKOFF_PER_LEVEL per level, chosen among each trie's BACKOFF_TOP best
  continuations (count desc, token asc);
- single branch: argmax chain (ties: smaller token); tree: best-first by path probability,
  ties by push order, children pushed best first; a node without continuations is extended by
  a fresh match on the last max_depth - 1 tokens of context + path.
"""

from __future__ import annotations

import heapq
from collections import defaultdict

Counts = dict[tuple, dict[int, int]]

BACKOFF_MIN_MASS = 0.2  # rust/src/draft/mod.rs
BACKOFF_PER_LEVEL = 4
SIDE_AT = 8  # rust/src/trie/side.rs: nodes with more children rank them (a side table)
BACKOFF_TOP = SIDE_AT
TOP_K = 16  # rust/src/trie/side.rs: children a side table ranks, all a trie offers of one n-gram


def _windows_into(children: Counts, text: list[int], depth: int, ends: range) -> None:
    for j in ends:
        for s in range(max(0, j - depth + 1), j + 1):
            p = tuple(text[s:j])
            children.setdefault(p, defaultdict(int))[text[j]] += 1


class ReferenceCache:
    """Brute-force model of `lookahead.LookaheadCache` (same method names)."""

    def __init__(
        self,
        max_depth=12,
        own_weight=4.0,
        history_weight=1.0,
        keep_prompt_as_history=False,
        history_skip=(3, 6),
    ):
        self.depth = max_depth
        self.skip = history_skip
        self.wp = float(own_weight)
        self.wo = float(history_weight)
        self.keep = keep_prompt_as_history
        self.history: dict[str, Counts] = defaultdict(dict)
        self.requests: dict = {}

    def start_request(self, rid, prompt, namespace="default"):
        prompt = [int(t) for t in prompt]
        assert rid not in self.requests and prompt
        ptrie: Counts = {}
        _windows_into(ptrie, prompt, self.depth, range(len(prompt)))
        self.requests[rid] = {"ns": namespace, "prompt": prompt, "ctx": list(prompt), "trie": ptrie}

    def extend(self, rid, tokens):
        r = self.requests[rid]
        start = len(r["ctx"])
        r["ctx"].extend(int(t) for t in tokens)
        for trie in self._output_tries(r):
            _windows_into(trie, r["ctx"], self.depth, range(start, len(r["ctx"])))

    def _output_tries(self, r):
        """The tries a verified token's n-grams are counted into: history and the request's."""
        return (self.history[r["ns"]], r["trie"])

    def finish_request(self, rid, keep_prompt=None):
        r = self.requests.pop(rid)
        if self.keep if keep_prompt is None else keep_prompt:
            self.add_history([r["prompt"]], r["ns"])

    def add_history(self, corpus, namespace="default"):
        for text in corpus:
            text = [int(t) for t in text]
            _windows_into(self.history[namespace], text, self.depth, range(len(text)))

    # drafting -------------------------------------------------------------------------
    def _tries(self, r):
        return [(r["trie"], self.wp), (self.history[r["ns"]], self.wo)]

    @staticmethod
    def _raw(trie: Counts, p: tuple) -> dict[int, int]:
        return {t: c for t, c in trie.get(p, {}).items() if c > 0}

    def _answers(self, x: int, p: tuple) -> bool:
        """Whether trie x (0: the request's, 1: the history) takes part at n-gram `p`."""
        return x == 0 or self.skip is None or not self.skip[0] <= len(p) <= self.skip[1]

    def _conts(self, r, state):
        """Per trie, the continuations of `state` that count (none where it does not take part)."""
        p, tracked = state
        return [
            self._raw(trie, p) if on and self._answers(x, p) else {}
            for x, ((trie, _), on) in enumerate(zip(self._tries(r), tracked))
        ]

    def _state(self, r, p):
        tracked = tuple(w > 0 and bool(self._raw(trie, p)) for trie, w in self._tries(r))
        takes_part = any(on and self._answers(x, p) for x, on in enumerate(tracked))
        return (p, tracked) if takes_part else None

    def _match(self, r, ctx):
        for k in range(min(len(ctx), self.depth - 1), 0, -1):
            st = self._state(r, tuple(ctx[-k:]))
            if st is not None:
                return st
        return None

    def _mass(self, r, state):
        """Sum of the scores of all continuations of `state`, computed as the core does."""
        terms, wsum = [], 0.0
        for (_, w), c in zip(self._tries(r), self._conts(r, state)):
            if c:
                s = sum(c.values())
                terms.append(w * s / float(s + len(c)))
                wsum += w
        return sum(terms) / wsum if wsum else 0.0

    def _candidates(self, r, state, top=False):
        """Scored continuations, best first; a trie offers its TOP_K best (`top`: its
        BACKOFF_TOP best)."""
        p, tracked = state
        conts = self._conts(r, state)
        # A trie left out here still follows the path where it continues it.
        raw = [self._raw(trie, p) if on else {} for (trie, _), on in zip(self._tries(r), tracked)]
        sums = [sum(c.values()) for c in conts]
        dens = [float(sum(c.values()) + len(c)) for c in conts]
        wp = self.wp if sums[0] > 0 else 0.0
        wo = self.wo if sums[1] > 0 else 0.0
        most = BACKOFF_TOP if top else TOP_K
        offered = [set(sorted(c, key=lambda t, c=c: (-c[t], t))[:most]) for c in conts]
        out = []
        for t in offered[0] | offered[1]:
            cp, ch = conts[0].get(t, 0), conts[1].get(t, 0)
            a = wp * cp / dens[0] if sums[0] > 0 else 0.0
            b = wo * ch / dens[1] if sums[1] > 0 else 0.0
            follows = (raw[0].get(t, 0) > 0, raw[1].get(t, 0) > 0)
            out.append(((a + b) / (wp + wo), t, (p + (t,), follows)))
        out.sort(key=lambda x: (-x[0], x[1]))
        return out

    def _continuations(self, r, state):
        """Tokens with a positive count after `state`'s n-gram in a tracked trie."""
        return {t for c in self._conts(r, state) for t in c}

    def _expand(self, r, path_tokens, state, is_root):
        cands = self._candidates(r, state) if state is not None else []
        if not cands and not is_root:
            buf = (r["ctx"] + path_tokens)[-(self.depth - 1) :]
            state = self._match(r, buf)
            cands = self._candidates(r, state) if state is not None else []
        if not cands or not is_root:
            return cands
        p = state[0]
        # Every continuation of a longer suffix is excluded, offered or not: its score is in
        # that suffix's mass, not in the escape.
        seen = self._continuations(r, state)
        left = 1.0 - self._mass(r, state)
        for k in range(len(p) - 1, 0, -1):
            if left < BACKOFF_MIN_MASS:
                break
            st = self._state(r, p[-k:])
            if st is None:
                continue
            lower = self._candidates(r, st, top=True)
            cands += [(s * left, t, c) for s, t, c in lower if t not in seen][:BACKOFF_PER_LEVEL]
            seen |= self._continuations(r, st)
            left *= 1.0 - self._mass(r, st)
        cands.sort(key=lambda x: (-x[0], x[1]))
        return cands

    def draft(self, rid, budget=16, multi_branch=True):
        """(tokens, parents, scores) lists, node 0 = last context token."""
        r = self.requests[rid]
        tokens, parents, probs, paths = [r["ctx"][-1]], [-1], [1.0], [[]]
        root = self._match(r, r["ctx"])
        if root is None:
            return tokens, parents, probs
        if not multi_branch:
            state, i = root, 0
            while len(tokens) <= budget:
                cands = self._expand(r, paths[i], state, i == 0)
                if not cands:
                    break
                score, t, child = cands[0]
                tokens.append(t)
                parents.append(i)
                probs.append(probs[i] * score)
                paths.append(paths[i] + [t])
                i, state = len(tokens) - 1, child
            return tokens, parents, probs
        heap, seq = [], 0
        for score, t, child in self._expand(r, [], root, True):
            heapq.heappush(heap, (-(1.0 * score), seq, 0, t, child))
            seq += 1
        while len(tokens) <= budget and heap:
            negp, _, par, t, child = heapq.heappop(heap)
            i = len(tokens)
            tokens.append(t)
            parents.append(par)
            probs.append(-negp)
            paths.append(paths[par] + [t])
            for score, t2, child2 in self._expand(r, paths[i], child, False):
                heapq.heappush(heap, (-(probs[i] * score), seq, i, t2, child2))
                seq += 1
        return tokens, parents, probs
