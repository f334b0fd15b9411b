//! Scoring: a state's candidate continuations from both tries, and their scores.

use crate::arena::NONE;
use crate::trie::{Side, TOP_K};

use super::{Cand, Scratch, Sources, State, BACKOFF_TOP, HISTORY, OWN};

/// Whether `side`'s ranked list stands for its node's children: without eviction it lists
/// the `TOP_K` best (or all) of them. Eviction leaves lists approximate, and short where
/// listed children were freed (refilled as other children are counted): a list still holding
/// half of what it should answers, a shorter or empty one has every child scored (a scan
/// on each draft of a hub until then would cost more than the approximation). Backoff
/// (`top`) takes whatever is listed.
#[inline]
pub(super) fn offers(side: &Side, top: bool) -> bool {
    side.sum > 0
        && !side.top.is_empty()
        && (top || side.top.len() >= side.num_children().min(TOP_K / 2))
}

/// Keeps the best `room` candidates of `out`, best first (score desc, token asc).
pub(super) fn keep_best(out: &mut Vec<Cand>, room: usize) {
    if out.len() <= 1 {
        out.truncate(room);
        return;
    }
    let better = |x: &Cand, y: &Cand| y.score.total_cmp(&x.score).then(x.token.cmp(&y.token));
    if room < out.len() {
        if room == 0 {
            out.clear();
            return;
        }
        out.select_nth_unstable_by(room - 1, better);
        out.truncate(room);
    }
    out.sort_unstable_by(better);
}

/// One offered child with both tries' sides of it: its token, and its count and node in
/// each trie (0 / `NONE` where a trie lacks it), indexed by `OWN` / `HISTORY`.
#[derive(Clone, Copy, Debug)]
pub struct Row {
    pub token: u32,
    pub counts: [u32; 2],
    pub nodes: [u32; 2],
}

/// Merges `raw`'s entries of the same token (one per trie: the first `split` from the
/// own trie, the rest from the history) into one holding both counts and children (a
/// trie's missing side is 0 / `NONE` = u32::MAX, or both sides when looked up).
pub(super) fn fold_by_token(raw: &mut Vec<Row>, split: usize) {
    let merge = |kept: &mut Row, r: Row| {
        for x in [OWN, HISTORY] {
            kept.counts[x] = kept.counts[x].max(r.counts[x]);
            kept.nodes[x] = kept.nodes[x].min(r.nodes[x]);
        }
    };
    if split == 0 || split == raw.len() {
        return;
    }
    if split <= 16 {
        let mut j = split;
        while j < raw.len() {
            let h = raw[j];
            if let Some(p) = raw[..split].iter_mut().find(|r| r.token == h.token) {
                merge(p, h);
                raw.swap_remove(j);
            } else {
                j += 1;
            }
        }
    } else {
        raw.sort_unstable_by_key(|r| r.token);
        raw.dedup_by(|later, kept| {
            let same = later.token == kept.token;
            if same {
                merge(kept, *later);
            }
            same
        });
    }
}

impl Sources<'_> {
    /// Scored continuations of `st`, best first (score desc, token asc), into `out`; only
    /// the best `room` are kept.
    ///
    /// A trie whose node ranks its children in a side table offers its ranked list (the
    /// `TOP_K` best), looked up in the other trie; without side tables every child is scored.
    ///
    /// Returns the sum of the scores of ALL of `st`'s candidates (not only those kept), and
    /// whether `out` holds every continuation of `st` (none unoffered or cut by `room`).
    pub fn candidates(
        &self,
        st: State,
        room: usize,
        scratch: &mut Scratch,
        out: &mut Vec<Cand>,
    ) -> (f64, bool) {
        let answer = self.scored(st, room, false, scratch, out);
        // The tree expands some of these next: start loading their first children now, so
        // the loads overlap instead of waiting one after another.
        let tries = [self.own, self.history];
        for c in out.iter_mut() {
            c.child.len = st.len + 1;
            for (x, t) in tries.iter().enumerate() {
                if let (Some(t), true) = (t, c.child.nodes[x] != NONE) {
                    t.arena.prefetch(t.node(c.child.nodes[x]).first_child);
                }
            }
        }
        answer
    }

    /// The best `room` continuations of `st` into `out`, its mass, and whether `out` holds
    /// every continuation (every child offered, none cut by `room`). A trie with a side table
    /// offers its ranked children (`top`, backoff: only its `BACKOFF_TOP` best), looked up in
    /// the other trie where that one ranks too; a trie without one offers all its children,
    /// paired with the other's entries by token. Scores are exact.
    pub(super) fn scored(
        &self,
        st: State,
        room: usize,
        top: bool,
        scratch: &mut Scratch,
        out: &mut Vec<Cand>,
    ) -> (f64, bool) {
        let tries = self.tries();
        let live = [self.part(&st, 0), self.part(&st, 1)];
        out.clear();
        let leaf = |x: usize| live[x].is_none_or(|t| t.node(st.nodes[x]).first_child == NONE);
        if leaf(0) && leaf(1) {
            // A window's end (common deep in a branch): nothing to score, no mass.
            return (0.0, room > 0);
        }
        let mut ranked: [Option<&Side>; 2] = [None, None];
        let offer = if top { BACKOFF_TOP } else { TOP_K };
        let mut every_child = true;
        for (x, r) in ranked.iter_mut().enumerate() {
            if let Some(side) = live[x].and_then(|t| t.side(st.nodes[x])) {
                if offers(side, top) {
                    *r = Some(side);
                    every_child &= side.top.len().min(offer) == side.num_children();
                }
            }
        }
        let raw = &mut scratch.raw;
        raw.clear();
        let mut sums = [0u64; 2];
        let mut kids = [0u64; 2];
        let mut split = 0;
        for x in 0..2 {
            if let Some(t) = live[x] {
                let y = 1 - x;
                // Only a ranked list is looked up (a hash map); a trie without one lists all
                // its children here, and the fold below pairs the entries by token.
                let other = live[y].filter(|_| ranked[y].is_some());
                let mut add = |tok: u32, cnt: u32, c: u32| {
                    let (mut oc, mut on) = (0, NONE);
                    if let Some(o) = other {
                        let n = o.find_child(st.nodes[y], tok);
                        if n != NONE && o.node(n).count > 0 {
                            (oc, on) = (o.node(n).count, n);
                        }
                    }
                    let mut row = Row {
                        token: tok,
                        counts: [oc; 2],
                        nodes: [on; 2],
                    };
                    (row.counts[x], row.nodes[x]) = (cnt, c);
                    raw.push(row);
                };
                match ranked[x] {
                    Some(side) => {
                        sums[x] = side.sum;
                        kids[x] = u64::from(side.positive);
                        for r in side.top.iter().take(offer) {
                            if r.count > 0 {
                                add(r.token, r.count, r.child);
                            }
                        }
                    }
                    None => {
                        for (tok, c, cnt) in t.counted_children(st.nodes[x]) {
                            if cnt > 0 {
                                sums[x] += u64::from(cnt);
                                kids[x] += 1;
                                add(tok, cnt, c);
                            }
                        }
                    }
                }
            }
            if x == 0 {
                split = raw.len();
            }
        }
        if raw.is_empty() {
            // Children of count 0 only (decayed by eviction): no mass either (`mass` would
            // divide 0 by 0).
            return (0.0, every_child && room > 0);
        }
        fold_by_token(raw, split);
        let (w_own, w_hist, dens) = self.weights(sums, kids);
        let wsum = w_own + w_hist;
        out.extend(
            raw.iter()
                .map(|r| Self::score(r, dens, w_own, w_hist, wsum)),
        );
        let all = every_child && out.len() < room;
        keep_best(out, room);
        if let Some(h) = tries[1].0.filter(|_| {
            tries[1].1 > 0.0 && st.nodes[HISTORY] != NONE && !self.history_answers(st.len as usize)
        }) {
            // A history left out here still follows the path: deeper, it may answer again.
            for c in out.iter_mut() {
                let n = h.find_child(st.nodes[HISTORY], c.token);
                if n != NONE && h.node(n).count > 0 {
                    c.child.nodes[HISTORY] = n;
                }
            }
        }
        (Self::mass(sums, dens, w_own, w_hist, wsum), all)
    }

    /// Sum of the scores of all children of a state (`1 - mass` is its escape mass).
    pub(super) fn mass(sums: [u64; 2], dens: [f64; 2], w_own: f64, w_hist: f64, wsum: f64) -> f64 {
        let a = if w_own > 0.0 {
            w_own * sums[0] as f64 / dens[0]
        } else {
            0.0
        };
        let b = if w_hist > 0.0 {
            w_hist * sums[1] as f64 / dens[1]
        } else {
            0.0
        };
        (a + b) / wsum
    }

    /// Weights of the participating tries and their score denominators `S + D`.
    pub(super) fn weights(&self, sums: [u64; 2], kids: [u64; 2]) -> (f64, f64, [f64; 2]) {
        let w_own = if sums[0] > 0 { self.own_weight } else { 0.0 };
        let w_hist = if sums[1] > 0 {
            self.history_weight
        } else {
            0.0
        };
        let dens = [(sums[0] + kids[0]) as f64, (sums[1] + kids[1]) as f64];
        (w_own, w_hist, dens)
    }

    #[inline]
    pub(super) fn score(r: &Row, dens: [f64; 2], w_own: f64, w_hist: f64, wsum: f64) -> Cand {
        let a = if w_own > 0.0 {
            w_own * f64::from(r.counts[OWN]) / dens[0]
        } else {
            0.0
        };
        let b = if w_hist > 0.0 {
            w_hist * f64::from(r.counts[HISTORY]) / dens[1]
        } else {
            0.0
        };
        Cand {
            token: r.token,
            score: (a + b) / wsum,
            child: State {
                nodes: r.nodes,
                len: 0,
            },
        }
    }
}
