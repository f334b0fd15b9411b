//! Matching: the state of the context's longest suffix that the tries continue.

use crate::arena::NONE;
use crate::trie::Trie;

use super::{Sources, State, EMPTY, HISTORY, OWN};

/// The largest `k` in `lo + 1..hi` for which `f(k)` is `Some`, with its value, by binary
/// search: `f` holds (or `lo` is a floor) at `lo`, fails at `hi`, and is monotone between.
pub(super) fn longest_some<T>(
    mut lo: usize,
    mut hi: usize,
    f: impl Fn(usize) -> Option<T>,
) -> Option<(usize, T)> {
    let mut best = None;
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        match f(mid) {
            Some(v) => {
                lo = mid;
                best = Some((mid, v));
            }
            None => hi = mid,
        }
    }
    best
}

impl Sources<'_> {
    pub(super) fn tries(&self) -> [(Option<&Trie>, f64); 2] {
        [
            (self.own, self.own_weight),
            (self.history, self.history_weight),
        ]
    }

    /// Whether the history takes part in a state of a `k`-token context: not for `k` in
    /// `history_skip`. A match of a few tokens in other requests' text is mostly a
    /// coincidence whose continuation would outrank the request's own shorter matches; one or
    /// two tokens give common continuations, and long matches are real repeats
    /// (research/README.md).
    #[inline]
    pub(super) fn history_answers(&self, k: usize) -> bool {
        self.history_skip.is_none_or(|(lo, hi)| k < lo || k > hi)
    }

    /// Trie `x` (0: the request's, 1: the history) if it takes part in state `st`: it has a
    /// positive weight and a node there, and (the history) answers at that length.
    #[inline]
    pub(super) fn part(&self, st: &State, x: usize) -> Option<&Trie> {
        if x == 0 {
            self.own
                .filter(|_| self.own_weight > 0.0 && st.nodes[OWN] != NONE)
        } else {
            self.history.filter(|_| {
                self.history_weight > 0.0
                    && st.nodes[HISTORY] != NONE
                    && self.history_answers(st.len as usize)
            })
        }
    }

    /// Whether a trie takes part in state `st`.
    #[inline]
    pub(super) fn takes_part(&self, st: &State) -> bool {
        self.part(st, 0).is_some() || self.part(st, 1).is_some()
    }

    /// The state of the longest suffix of `ctx` shorter than `st`'s that a trie takes part
    /// in, reached from `st` by suffix links where possible.
    pub(super) fn shorter_taking_part(&self, ctx: &[u32], st: State) -> Option<State> {
        (1..st.len as usize).rev().find_map(|k| {
            self.probe(ctx, k, Some(st), false)
                .filter(|s| self.takes_part(s))
        })
    }

    /// State of the `k`-token suffix of `ctx` if it has a continuation in a participating
    /// trie. `hint`, the state of a longer suffix of `ctx`, lets a trie with suffix links
    /// reach the node by following links instead of walking from the root; `cursors`: `ctx`
    /// is the draft's own context, whose suffixes' nodes `suffixes` holds (not a context
    /// extended by a draft path).
    pub(super) fn probe(
        &self,
        ctx: &[u32],
        k: usize,
        hint: Option<State>,
        cursors: bool,
    ) -> Option<State> {
        let s = &ctx[ctx.len() - k..];
        let mut st = EMPTY;
        st.len = k as u32;
        let mut any = false;
        for (x, (trie, w)) in self.tries().into_iter().enumerate() {
            if let Some(t) = trie.filter(|_| w > 0.0) {
                let mut n = NONE;
                if let Some(h) = hint.filter(|h| h.nodes[x] != NONE && h.len as usize >= k) {
                    n = h.nodes[x];
                    for _ in k..h.len as usize {
                        n = t.node(n).link;
                        if n == NONE {
                            break;
                        }
                    }
                }
                // No hint: the first match, on the context itself.
                if n == NONE && hint.is_none() && cursors {
                    n = self.suffixes[x].get(k - 1).copied().unwrap_or(NONE);
                    debug_assert!(n == NONE || n == t.walk(s), "stale cursor for trie {x}");
                }
                if n == NONE {
                    n = t.walk(s);
                }
                if n != NONE && t.has_continuation(n) {
                    st.nodes[x] = n;
                    any = true;
                }
            }
        }
        any.then_some(st)
    }

    /// State of the longest suffix of `ctx` (at most `max_depth - 1` tokens) that has a
    /// continuation in a participating trie; `None` if no suffix has one.
    ///
    /// Every trie stores all windows ending at each indexed position, so every suffix of a
    /// stored n-gram is stored too: "the k-suffix has a continuation" is monotone in k and a
    /// binary search finds the longest. (After eviction removed some n-grams this may settle
    /// on a shorter suffix than a linear scan would.) Where no trie takes part (the history
    /// only, left out by `history_skip`), the search goes on down from there.
    pub fn match_suffix(&self, ctx: &[u32]) -> Option<State> {
        self.match_hinted(ctx, None, true)
    }

    /// `match_suffix` where `hint` is the state of a suffix of `ctx` without continuations in
    /// the tries it tracks (so, if it tracks all, only shorter suffixes can match); shorter
    /// suffixes are reached through suffix links where possible. `cursors`: as in `probe`.
    pub(super) fn match_hinted(
        &self,
        ctx: &[u32],
        hint: Option<State>,
        cursors: bool,
    ) -> Option<State> {
        let mut longest = ctx.len().min(self.max_depth.saturating_sub(1));
        if let Some(h) = hint {
            // The hint's n-gram `g` has no continuation in the tries that take part in it, so
            // neither has any longer suffix there (every suffix of a stored window is stored).
            // A trie it does not track (`NONE`: no counted node for `g`) may still continue `g`
            // through a count-0 prefix node, and then longer suffixes too; so may a history
            // left out by `history_skip`.
            let k = h.len as usize;
            let skipped = h.nodes[HISTORY] != NONE && !self.history_answers(k);
            let (mut untracked, mut uncapped) = (skipped, false);
            for (x, (t, w)) in self.tries().into_iter().enumerate() {
                if let Some(t) = t.filter(|_| w > 0.0 && h.nodes[x] == NONE) {
                    untracked = true;
                    if k < longest {
                        let n = t.walk(&ctx[ctx.len() - k..]);
                        uncapped |= n != NONE && t.has_continuation(n);
                    }
                }
            }
            if skipped && !uncapped {
                // That history may continue longer suffixes, where it answers again.
                if let Some(st) = self.history_above(ctx, h, longest) {
                    return Some(st);
                }
            }
            if !uncapped {
                longest = longest.min(k - usize::from(!untracked));
            }
        }
        if longest == 0 {
            return None;
        }
        let probe = |k: usize| self.probe(ctx, k, hint, cursors);
        let st = match probe(longest) {
            Some(st) => st,
            None => longest_some(0, longest, probe)?.1,
        };
        // Down from the longest match to the first state a trie takes part in.
        if self.takes_part(&st) {
            Some(st)
        } else {
            self.shorter_taking_part(ctx, st)
        }
    }

    /// For `match_hinted` with hint `h` whose history node is left out by `history_skip`:
    /// the state of the longest suffix of `ctx`, beyond the skipped lengths and at most
    /// `longest` tokens, that the history continues (the other trie cannot continue a
    /// suffix longer than `h`'s), if any.
    pub(super) fn history_above(&self, ctx: &[u32], h: State, longest: usize) -> Option<State> {
        let (_, hi) = self.history_skip?;
        let history = self.history.filter(|_| self.history_weight > 0.0)?;
        let continues = |k: usize| {
            let n = history.walk(&ctx[ctx.len() - k..]);
            (n != NONE && history.has_continuation(n)).then_some(n)
        };
        let from = hi.saturating_add(1).max(h.len as usize + 1);
        if from > longest {
            return None;
        }
        let first = continues(from)?;
        let (k, n) = longest_some(from, longest + 1, continues).unwrap_or((from, first));
        Some(State {
            nodes: [NONE, n],
            len: k as u32,
        })
    }

    /// Whether a participating trie continues state `st` with `token` (count > 0).
    pub(super) fn continues(&self, st: State, token: u32) -> bool {
        (0..2).any(|x| {
            self.part(&st, x).is_some_and(|t| {
                let n = t.find_child(st.nodes[x], token);
                n != NONE && t.node(n).count > 0
            })
        })
    }
}
