//! Drafting: suffix matching, child scoring, the greedy chain and the best-first tree.
//!
//! A *state* is the pair (prompt-trie node, history-trie node) of one n-gram `p` (either may be
//! `NONE`). The score of child token `t` of `p` is
//!
//! ```text
//! score(t) = (w_p * c_P(p,t) / (S_P(p) + D_P(p)) + w_o * c_H(p,t) / (S_H(p) + D_H(p))) / (w_p + w_o)
//! ```
//!
//! where `c_X(p,t)` is the count of n-gram `p+t` in trie X, `S_X(p)` the sum of the positive
//! child counts of `p` in X, `D_X(p)` the number of those children, and a trie takes part
//! (its term and its weight in the denominator) only where its weight is positive and
//! `S_X(p) > 0`. `D` is Witten-Bell's escape mass: the chance that `p` continues with a token
//! never seen after it, high for rare n-grams (a count-1 match scores 1/2, not 1), so the
//! best-first tree spreads over siblings near the root instead of betting the whole budget on
//! one long chain of a once-seen n-gram. Scores of one state sum to `< 1`; what is left (the
//! escape mass) goes, at the root, to the continuations of shorter suffixes
//! (`BACKOFF_MIN_MASS`). A draft node's score is the product of the scores along its path
//! (its estimated probability).
//! Children with count 0 (decayed by eviction) are not candidates. Ties are broken by token
//! id (smaller first) and, in the tree, by the order candidates were pushed.
//!
//! Candidates of a state: a trie whose node has more than `TOP_K` children offers only its
//! `TOP_K` best (count desc, token asc; `Side::top`), the other trie all of its own (or its
//! `TOP_K` best); each offered token is scored with both tries' counts, `S` and `D` over all
//! children. So a draft never visits the long tail of a short context's continuations (a
//! unigram of a large history has thousands), whose scores are below the listed ones'.

use std::collections::BinaryHeap;

use crate::arena::NONE;
use crate::recycle::Recycled;
use crate::trie::{Side, Trie, SIDE_AT, TOP_K};

/// Backoff at the root: after the candidates of the context's matched n-gram `p` come those
/// of `p`'s shorter suffixes (tokens already continuing a longer suffix excluded), each scaled
/// by the escape mass left, `prod (1 - sum of scores)` over the longer levels, while that mass
/// is at least this. Simulator, B = 16 (research/README.md): 2.666 -> 2.693 tokens per step;
/// backing off at every draft node reached 2.705 but made drafts 3-5x slower.
pub const BACKOFF_MIN_MASS: f64 = 0.2;

/// Each backoff level adds at most its best this many (non-excluded) candidates, chosen
/// among each trie's `BACKOFF_TOP` best children: short contexts have hundreds of children,
/// and scoring them all costs more than it brings.
pub const BACKOFF_PER_LEVEL: usize = 4;
/// How many ranked children a trie offers at a backoff level (= `SIDE_AT`, so every trie
/// offers its 8 best continuations, ranked by count desc, token asc).
pub const BACKOFF_TOP: usize = SIDE_AT;

/// (prompt-trie node, history-trie node, n-gram length); a node is `NONE` where that trie
/// does not continue the n-gram.
pub type State = [u32; 3];
const EMPTY: State = [NONE, NONE, 0];
/// The child state of a candidate no trie continues (a recycled prediction): expanding it
/// matches the context + path afresh.
const FRESH: State = [NONE, NONE, u32::MAX];

/// Recycled predictions join the candidates of a node only where the tries continue an
/// n-gram of at most this many tokens (or none): a longer match is a copy that the target's
/// predictions after one or two tokens would only crowd out. Simulator, B = 16, 120 traces
/// (BENCHMARKS.md, "Recycled predictions"): 2.860 tokens per step at every node, 2.920 here
/// (the tries alone: 2.794); translation 3.594 at every node, 3.828 here (alone: 3.765).
pub const RECYCLE_MAX_MATCH: usize = 3;

/// The recycled predictions a draft reads (see `recycle.rs`) and how to weigh them.
pub struct RecycleView<'a> {
    pub table: &'a Recycled,
    /// The namespace the rows were written under.
    pub namespace: u64,
    /// A recycled token's score is `weight * p` (capped at 1), `p` the target's probability
    /// when it last followed the same key; beside a trie continuation of the same token the
    /// higher of the two scores counts.
    pub weight: f64,
}

/// The tries a draft reads and how to weigh them.
pub struct Sources<'a> {
    pub prompt: Option<&'a Trie>,
    pub history: Option<&'a Trie>,
    pub prompt_weight: f64,
    pub output_weight: f64,
    pub max_depth: usize,
    /// Per trie (prompt, history), its nodes of the context's suffixes (`[k-1]`: the k-token
    /// suffix), as `extend` keeps them; empty if unknown. Saves walking the tries from their
    /// roots for the first match.
    pub suffixes: [&'a [u32]; 2],
    /// Context lengths `lo..=hi` at which the history does not take part (see
    /// `history_answers`); `None`: it takes part at every length.
    pub history_skip: Option<(usize, usize)>,
    /// The target's recycled predictions, offered beside the tries' continuations where
    /// those come from a short match (`RECYCLE_MAX_MATCH`; `None`: trie drafts only).
    pub recycled: Option<RecycleView<'a>>,
}

/// A draft tree: node 0 is the root (last context token), `parents[0] == -1`.
#[derive(Debug, Clone, PartialEq)]
pub struct DraftTree {
    pub tokens: Vec<u32>,
    pub parents: Vec<i32>,
    pub scores: Vec<f32>,
}

impl DraftTree {
    pub fn num_nodes(&self) -> usize {
        self.tokens.len()
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Cand {
    pub token: u32,
    pub score: f64,
    pub child: State,
}

/// Buffers reused across the expansions of one draft, and across the drafts of one thread.
#[derive(Default)]
pub struct Scratch {
    raw: Vec<(u32, u32, u32, u32, u32)>,
    /// Fresh-match states already scored: (state, room asked, best-first list).
    memo: Vec<(State, usize, std::ops::Range<usize>)>,
    /// The memo's lists, back to back.
    memo_cands: Vec<Cand>,
    buf: Vec<u32>,
    lower: Vec<Cand>,
    excl: Vec<u32>,
    partial: Vec<State>,
}

/// The tree loop's own buffers, kept apart from `Scratch` because `expand` borrows both at once.
#[derive(Default)]
struct TreeBuffers {
    cands: Vec<Cand>,
    probs: Vec<f64>,
    /// Max-heap of `key(prob, seq)`; `pending[seq]` is the candidate pushed as `seq`.
    heap: BinaryHeap<u128>,
    pending: Vec<(u32, Cand)>,
}

/// Heap key of a candidate: probability first (non-negative, so its bits order as the
/// numbers do), then earlier push (`seq` inverted); one integer compare per sift.
#[inline]
fn key(prob: f64, seq: usize) -> u128 {
    debug_assert!(prob >= 0.0);
    (u128::from(prob.to_bits()) << 64) | u128::from(u64::MAX - seq as u64)
}

#[inline]
fn unkey(k: u128) -> (f64, usize) {
    (
        f64::from_bits((k >> 64) as u64),
        (u64::MAX - k as u64) as usize,
    )
}

/// Whether `side`'s ranked list stands for its node's children: without eviction it lists
/// the `TOP_K` best (or all) of them. Eviction leaves lists approximate, and short where
/// listed children were freed (refilled as other children are counted): a list still holding
/// half of what it should answers, a shorter or empty one has every child scored (a scan
/// on each draft of a hub until then would cost more than the approximation). Backoff
/// (`top`) takes whatever is listed.
#[inline]
fn offers(side: &Side, top: bool) -> bool {
    side.sum > 0
        && !side.top.is_empty()
        && (top || side.top.len() >= side.num_children().min(TOP_K / 2))
}

/// The largest `k` in `lo + 1..hi` for which `f(k)` is `Some`, with its value, by binary
/// search: `f` holds (or `lo` is a floor) at `lo`, fails at `hi`, and is monotone between.
fn longest_some<T>(
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

/// Keeps the best `room` candidates of `out`, best first (score desc, token asc).
fn keep_best(out: &mut Vec<Cand>, room: usize) {
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

/// Merges `raw`'s entries of the same token (one per trie: the first `split` from the
/// prompt trie, the rest from the history) into one holding both counts and children (a
/// trie's missing side is 0 / `NONE` = u32::MAX, or both sides when looked up).
fn fold_by_token(raw: &mut Vec<(u32, u32, u32, u32, u32)>, split: usize) {
    let merge = |kept: &mut (u32, u32, u32, u32, u32), r: (u32, u32, u32, u32, u32)| {
        (kept.1, kept.2) = (kept.1.max(r.1), kept.2.max(r.2));
        (kept.3, kept.4) = (kept.3.min(r.3), kept.4.min(r.4));
    };
    if split == 0 || split == raw.len() {
        return;
    }
    if split <= 16 {
        let mut j = split;
        while j < raw.len() {
            let h = raw[j];
            if let Some(p) = raw[..split].iter_mut().find(|r| r.0 == h.0) {
                merge(p, h);
                raw.swap_remove(j);
            } else {
                j += 1;
            }
        }
    } else {
        raw.sort_unstable_by_key(|r| r.0);
        raw.dedup_by(|later, kept| {
            let same = later.0 == kept.0;
            if same {
                merge(kept, *later);
            }
            same
        });
    }
}

impl Sources<'_> {
    fn tries(&self) -> [(Option<&Trie>, f64); 2] {
        [
            (self.prompt, self.prompt_weight),
            (self.history, self.output_weight),
        ]
    }

    /// Whether the history takes part in a state of a `k`-token context: not for `k` in
    /// `history_skip`. A match of a few tokens in other requests' text is mostly a
    /// coincidence whose continuation would outrank the request's own shorter matches; one or
    /// two tokens give common continuations, and long matches are real repeats (BENCHMARKS.md
    /// §2.1).
    #[inline]
    fn history_answers(&self, k: usize) -> bool {
        self.history_skip.is_none_or(|(lo, hi)| k < lo || k > hi)
    }

    /// Trie `x` (0: the request's, 1: the history) if it takes part in state `st`: it has a
    /// positive weight and a node there, and (the history) answers at that length.
    #[inline]
    fn part(&self, st: &State, x: usize) -> Option<&Trie> {
        if x == 0 {
            self.prompt
                .filter(|_| self.prompt_weight > 0.0 && st[0] != NONE)
        } else {
            self.history.filter(|_| {
                self.output_weight > 0.0 && st[1] != NONE && self.history_answers(st[2] as usize)
            })
        }
    }

    /// Whether a trie takes part in state `st`.
    #[inline]
    fn takes_part(&self, st: &State) -> bool {
        self.part(st, 0).is_some() || self.part(st, 1).is_some()
    }

    /// The state of the longest suffix of `ctx` shorter than `st`'s that a trie takes part
    /// in, reached from `st` by suffix links where possible.
    fn shorter_taking_part(&self, ctx: &[u32], st: State) -> Option<State> {
        (1..st[2] as usize).rev().find_map(|k| {
            self.probe(ctx, k, Some(st), false)
                .filter(|s| self.takes_part(s))
        })
    }

    /// State of the `k`-token suffix of `ctx` if it has a continuation in a participating
    /// trie. `hint`, the state of a longer suffix of `ctx`, lets a trie with suffix links
    /// reach the node by following links instead of walking from the root; `cursors`: `ctx`
    /// is the draft's own context, whose suffixes' nodes `suffixes` holds (not a context
    /// extended by a draft path).
    fn probe(&self, ctx: &[u32], k: usize, hint: Option<State>, cursors: bool) -> Option<State> {
        let s = &ctx[ctx.len() - k..];
        let mut st = EMPTY;
        st[2] = k as u32;
        let mut any = false;
        for (x, (trie, w)) in self.tries().into_iter().enumerate() {
            if let Some(t) = trie.filter(|_| w > 0.0) {
                let mut n = NONE;
                if let Some(h) = hint.filter(|h| h[x] != NONE && h[2] as usize >= k) {
                    n = h[x];
                    for _ in k..h[2] as usize {
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
                    st[x] = n;
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
    fn match_hinted(&self, ctx: &[u32], hint: Option<State>, cursors: bool) -> Option<State> {
        let mut longest = ctx.len().min(self.max_depth.saturating_sub(1));
        if let Some(h) = hint {
            // The hint's n-gram `g` has no continuation in the tries that take part in it, so
            // neither has any longer suffix there (every suffix of a stored window is stored).
            // A trie it does not track (`NONE`: no counted node for `g`) may still continue `g`
            // through a count-0 prefix node, and then longer suffixes too; so may a history
            // left out by `history_skip`.
            let k = h[2] as usize;
            let skipped = h[1] != NONE && !self.history_answers(k);
            let (mut untracked, mut uncapped) = (skipped, false);
            for (x, (t, w)) in self.tries().into_iter().enumerate() {
                if let Some(t) = t.filter(|_| w > 0.0 && h[x] == NONE) {
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
    fn history_above(&self, ctx: &[u32], h: State, longest: usize) -> Option<State> {
        let (_, hi) = self.history_skip?;
        let history = self.history.filter(|_| self.output_weight > 0.0)?;
        let continues = |k: usize| {
            let n = history.walk(&ctx[ctx.len() - k..]);
            (n != NONE && history.has_continuation(n)).then_some(n)
        };
        let from = hi.saturating_add(1).max(h[2] as usize + 1);
        if from > longest {
            return None;
        }
        let first = continues(from)?;
        let (k, n) = longest_some(from, longest + 1, continues).unwrap_or((from, first));
        Some([NONE, n, k as u32])
    }

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
        let tries = [self.prompt, self.history];
        for c in out.iter_mut() {
            c.child[2] = st[2] + 1;
            for (x, t) in tries.iter().enumerate() {
                if let (Some(t), true) = (t, c.child[x] != NONE) {
                    t.arena.prefetch(t.node(c.child[x]).first_child);
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
    fn scored(
        &self,
        st: State,
        room: usize,
        top: bool,
        scratch: &mut Scratch,
        out: &mut Vec<Cand>,
    ) -> (f64, bool) {
        let tries = self.tries();
        let live = |x: usize| self.part(&st, x);
        let mut ranked: [Option<&Side>; 2] = [None, None];
        let offer = if top { BACKOFF_TOP } else { TOP_K };
        let mut every_child = true;
        for (x, r) in ranked.iter_mut().enumerate() {
            if let Some(side) = live(x).and_then(|t| t.side(st[x])) {
                if offers(side, top) {
                    *r = Some(side);
                    every_child &= side.top.len().min(offer) == side.num_children();
                }
            }
        }
        out.clear();
        // (token, count in prompt, count in history, child in prompt, child in history)
        let raw = &mut scratch.raw;
        raw.clear();
        let mut sums = [0u64; 2];
        let mut kids = [0u64; 2];
        let mut split = 0;
        for x in 0..2 {
            if let Some(t) = live(x) {
                let y = 1 - x;
                // Only a ranked list is looked up (a hash map); a trie without one lists all
                // its children here, and the fold below pairs the entries by token.
                let other = live(y).filter(|_| ranked[y].is_some());
                let mut add = |tok: u32, cnt: u32, c: u32| {
                    let (mut oc, mut on) = (0, NONE);
                    if let Some(o) = other {
                        let n = o.find_child(st[y], tok);
                        if n != NONE && o.node(n).count > 0 {
                            (oc, on) = (o.node(n).count, n);
                        }
                    }
                    raw.push(if x == 0 {
                        (tok, cnt, oc, c, on)
                    } else {
                        (tok, oc, cnt, on, c)
                    });
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
                        for (tok, c, cnt) in t.counted_children(st[x]) {
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
        fold_by_token(raw, split);
        let (wp, wo, dens) = self.weights(sums, kids);
        let wsum = wp + wo;
        out.extend(raw.iter().map(|r| Self::score(r, dens, wp, wo, wsum)));
        let all = every_child && out.len() < room;
        keep_best(out, room);
        if let Some(h) = tries[1]
            .0
            .filter(|_| tries[1].1 > 0.0 && st[1] != NONE && !self.history_answers(st[2] as usize))
        {
            // A history left out here still follows the path: deeper, it may answer again.
            for c in out.iter_mut() {
                let n = h.find_child(st[1], c.token);
                if n != NONE && h.node(n).count > 0 {
                    c.child[1] = n;
                }
            }
        }
        (Self::mass(sums, dens, wp, wo, wsum), all)
    }

    /// Sum of the scores of all children of a state (`1 - mass` is its escape mass).
    fn mass(sums: [u64; 2], dens: [f64; 2], wp: f64, wo: f64, wsum: f64) -> f64 {
        let a = if wp > 0.0 {
            wp * sums[0] as f64 / dens[0]
        } else {
            0.0
        };
        let b = if wo > 0.0 {
            wo * sums[1] as f64 / dens[1]
        } else {
            0.0
        };
        (a + b) / wsum
    }

    /// Weights of the participating tries and their score denominators `S + D`.
    fn weights(&self, sums: [u64; 2], kids: [u64; 2]) -> (f64, f64, [f64; 2]) {
        let wp = if sums[0] > 0 { self.prompt_weight } else { 0.0 };
        let wo = if sums[1] > 0 { self.output_weight } else { 0.0 };
        let dens = [(sums[0] + kids[0]) as f64, (sums[1] + kids[1]) as f64];
        (wp, wo, dens)
    }

    #[inline]
    fn score(r: &(u32, u32, u32, u32, u32), dens: [f64; 2], wp: f64, wo: f64, wsum: f64) -> Cand {
        let a = if wp > 0.0 {
            wp * f64::from(r.1) / dens[0]
        } else {
            0.0
        };
        let b = if wo > 0.0 {
            wo * f64::from(r.2) / dens[1]
        } else {
            0.0
        };
        Cand {
            token: r.0,
            score: (a + b) / wsum,
            child: [r.3, r.4, 0],
        }
    }

    /// Continuations of draft node `i` of `tree`: those of its state, or, where that state
    /// has none (a window's end), those of a fresh match on context + path to `i`; at the
    /// root, followed by the backoff levels (see `BACKOFF_MIN_MASS`). Best first, at most
    /// `room`. Returns the length of the n-gram whose continuations they are (0: none).
    #[allow(clippy::too_many_arguments)]
    fn expand(
        &self,
        ctx: &[u32],
        tree: &DraftTree,
        i: usize,
        st: Option<State>,
        room: usize,
        scratch: &mut Scratch,
        out: &mut Vec<Cand>,
    ) -> usize {
        if let Some(st) = st {
            let (mass, every) = self.candidates(st, room, scratch, out);
            if i == 0 {
                self.back_off(ctx, st, mass, every, room, scratch, out);
                return st[2] as usize;
            }
            if !out.is_empty() {
                return st[2] as usize;
            }
        }
        // The last `max_depth - 1` tokens of context + path to `i`, collected backwards.
        let keep = self.max_depth.saturating_sub(1);
        let mut buf = std::mem::take(&mut scratch.buf);
        buf.clear();
        let mut j = i;
        while j != 0 && buf.len() < keep {
            buf.push(tree.tokens[j]);
            j = tree.parents[j] as usize;
        }
        let from_ctx = (keep - buf.len()).min(ctx.len());
        buf.extend(ctx[ctx.len() - from_ctx..].iter().rev());
        buf.reverse();
        // A recycled token's node has no state (`st` None) and is matched here on context +
        // path: the context's suffix cursors do not apply to it.
        let matched = self.match_hinted(&buf, st, i == 0);
        scratch.buf = buf;
        let Some(st) = matched else {
            out.clear();
            return 0;
        };
        // Fresh matches of one draft often land on the same (short) suffix: reuse its list
        // when it was computed for at least `room` entries (or was complete).
        if let Some((_, want, span)) = scratch.memo.iter().find(|m| m.0 == st) {
            if *want >= room || span.len() < *want {
                out.clear();
                let cands = &scratch.memo_cands[span.clone()];
                out.extend(cands.iter().take(room).copied());
                return st[2] as usize;
            }
        }
        self.candidates(st, room, scratch, out);
        let start = scratch.memo_cands.len();
        scratch.memo_cands.extend_from_slice(out);
        let span = start..scratch.memo_cands.len();
        scratch.memo.push((st, room, span));
        st[2] as usize
    }

    /// Adds to `out` (the root's candidates: those of `st`, a suffix of `ctx`, whose scores
    /// sum to `mass`; `every`: all of them) those of `st`'s shorter suffixes, tokens already
    /// continuing a longer one (offered or not) excluded, scaled by the escape mass left,
    /// while it is at least `BACKOFF_MIN_MASS`, at most `BACKOFF_PER_LEVEL` per level; keeps
    /// the best `room`.
    #[allow(clippy::too_many_arguments)]
    fn back_off(
        &self,
        ctx: &[u32],
        st: State,
        mass: f64,
        every: bool,
        room: usize,
        scratch: &mut Scratch,
        out: &mut Vec<Cand>,
    ) {
        let mut left = 1.0 - mass;
        if room == 0 || left < BACKOFF_MIN_MASS || st[2] <= 1 {
            return;
        }
        let mut lower = std::mem::take(&mut scratch.lower);
        // Tokens of the levels listed in full, and the levels cut short (looked up).
        let mut excl = std::mem::take(&mut scratch.excl);
        let mut partial = std::mem::take(&mut scratch.partial);
        excl.clear();
        partial.clear();
        // Every continuation of `st` is excluded below, offered or not: its score is in
        // `mass`, not in the escape. Listed in full: by token; else looked up.
        if every {
            excl.extend(out.iter().map(|c| c.token));
        } else {
            partial.push(st);
        }
        let mut cur = st;
        let mut added = false;
        while left >= BACKOFF_MIN_MASS && cur[2] > 1 {
            let Some(next) = self.shorter_taking_part(ctx, cur) else {
                break;
            };
            // Ask for more than `cap` when excluded tokens crowd the top of the list.
            let cap = room.min(BACKOFF_PER_LEVEL);
            let mut want = cap;
            let (next_mass, complete) = loop {
                let (m, all) = self.scored(next, want, true, scratch, &mut lower);
                for c in lower.iter_mut() {
                    c.child[2] = next[2] + 1;
                }
                let exhausted = lower.len() < want;
                lower.retain(|c| {
                    !excl.contains(&c.token) && !partial.iter().any(|&l| self.continues(l, c.token))
                });
                if lower.len() >= cap || exhausted {
                    break (m, all);
                }
                want = want.saturating_mul(2);
            };
            if complete {
                // The tokens dropped above are excluded below already.
                excl.extend(lower.iter().map(|c| c.token));
            } else {
                partial.push(next);
            }
            for c in lower.iter().take(cap) {
                out.push(Cand {
                    score: c.score * left,
                    ..*c
                });
                added = true;
            }
            left *= 1.0 - next_mass;
            cur = next;
        }
        if added {
            keep_best(out, room);
        }
        scratch.lower = lower;
        scratch.excl = excl;
        scratch.partial = partial;
    }

    /// Whether a participating trie continues state `st` with `token` (count > 0).
    fn continues(&self, st: State, token: u32) -> bool {
        (0..2).any(|x| {
            self.part(&st, x).is_some_and(|t| {
                let n = t.find_child(st[x], token);
                n != NONE && t.node(n).count > 0
            })
        })
    }

    /// Drafts up to `budget` nodes after `ctx` (non-empty; only its last `max_depth - 1`
    /// tokens are read): one greedy branch, or a best-first tree when `multi_branch`.
    pub fn draft(&self, ctx: &[u32], budget: usize, multi_branch: bool) -> DraftTree {
        thread_local! {
            // Drafts run back to back on the same threads: their buffers' allocations pay once.
            static BUFFERS: std::cell::Cell<(Scratch, TreeBuffers)> = Default::default();
        }
        let root = *ctx.last().expect("draft needs a non-empty context");
        let cap = budget.min(256) + 1;
        let mut tree = DraftTree {
            tokens: Vec::with_capacity(cap),
            parents: Vec::with_capacity(cap),
            scores: Vec::with_capacity(cap),
        };
        tree.tokens.push(root);
        tree.parents.push(-1);
        tree.scores.push(1.0);
        let root_state = self.match_suffix(ctx);
        if root_state.is_none() && self.recycled_row(ctx, &tree, 0).is_none() {
            return tree;
        }
        let (mut scratch, mut bufs) = BUFFERS.take();
        scratch.memo.clear();
        scratch.memo_cands.clear();
        self.grow(
            ctx,
            budget,
            multi_branch,
            root_state,
            &mut tree,
            &mut scratch,
            &mut bufs,
        );
        if budget <= 256 {
            // A huge draft's buffers are not worth keeping for the thread's lifetime.
            BUFFERS.set((scratch, bufs));
        }
        tree
    }

    /// The recycled row that followed node `i`'s token (after its parent's, the root's after
    /// the context's token before it, where that pair has a row), with its weight.
    fn recycled_row(
        &self,
        ctx: &[u32],
        tree: &DraftTree,
        i: usize,
    ) -> Option<(&[u32], &[f32], f64)> {
        let r = self.recycled.as_ref()?;
        let prev = if i == 0 {
            ctx.len().checked_sub(2).map(|j| ctx[j])
        } else {
            Some(tree.tokens[tree.parents[i] as usize])
        };
        let (ids, probs) = r.table.lookup(r.namespace, prev, tree.tokens[i])?;
        Some((ids, probs, r.weight))
    }

    /// Adds to `out` (node `i`'s trie candidates, best first, continuing an n-gram of
    /// `matched` tokens) the recycled predictions that followed node `i`'s token (after its
    /// parent's, where that pair has a row), scored `weight * p`, if `matched` is at most
    /// `RECYCLE_MAX_MATCH`; a token both offer keeps the higher score and the trie's state.
    /// Keeps the best `room`.
    fn add_recycled(
        &self,
        ctx: &[u32],
        tree: &DraftTree,
        i: usize,
        matched: usize,
        room: usize,
        out: &mut Vec<Cand>,
    ) {
        if matched > RECYCLE_MAX_MATCH {
            return;
        }
        let Some((ids, probs, weight)) = self.recycled_row(ctx, tree, i) else {
            return;
        };
        let trie_cands = out.len();
        for (&t, &p) in ids.iter().zip(probs) {
            let score = (weight * f64::from(p)).min(1.0);
            match out[..trie_cands].iter_mut().find(|c| c.token == t) {
                Some(c) => c.score = c.score.max(score),
                None => out.push(Cand {
                    token: t,
                    score,
                    child: FRESH,
                }),
            }
        }
        keep_best(out, room);
    }

    /// The body of `draft` once the root matched: adds up to `budget` nodes to `tree`.
    #[allow(clippy::too_many_arguments)]
    fn grow(
        &self,
        ctx: &[u32],
        budget: usize,
        multi_branch: bool,
        root_state: Option<State>,
        tree: &mut DraftTree,
        scratch: &mut Scratch,
        bufs: &mut TreeBuffers,
    ) {
        let TreeBuffers {
            cands,
            probs,
            heap,
            pending,
        } = bufs;
        probs.clear();
        probs.push(1.0);
        heap.clear();
        pending.clear();
        if !multi_branch {
            let mut st = root_state;
            let mut i = 0;
            while tree.num_nodes() <= budget {
                let m = self.expand(ctx, tree, i, st, 1, scratch, cands);
                self.add_recycled(ctx, tree, i, m, 1, cands);
                let Some(best) = cands.first().copied() else {
                    break;
                };
                let p = probs[i] * best.score;
                tree.tokens.push(best.token);
                tree.parents.push(i as i32);
                tree.scores.push(p as f32);
                probs.push(p);
                i = tree.num_nodes() - 1;
                st = (best.child != FRESH).then_some(best.child);
            }
            return;
        }
        let push_children = |heap: &mut BinaryHeap<u128>,
                             pending: &mut Vec<(u32, Cand)>,
                             cands: &[Cand],
                             parent: usize,
                             prob: f64,
                             room: usize| {
            for c in cands.iter().take(room) {
                heap.push(key(prob * c.score, pending.len()));
                pending.push((parent as u32, *c));
            }
        };
        let m = self.expand(ctx, tree, 0, root_state, budget, scratch, cands);
        self.add_recycled(ctx, tree, 0, m, budget, cands);
        push_children(heap, pending, cands, 0, 1.0, budget);
        while tree.num_nodes() <= budget {
            let Some(k) = heap.pop() else {
                break;
            };
            let (prob, seq) = unkey(k);
            let (parent, cand) = pending[seq];
            let i = tree.num_nodes();
            tree.tokens.push(cand.token);
            tree.parents.push(parent as i32);
            tree.scores.push(prob as f32);
            probs.push(prob);
            let room = budget + 1 - tree.num_nodes();
            if room == 0 {
                break;
            }
            let st = (cand.child != FRESH).then_some(cand.child);
            let m = self.expand(ctx, tree, i, st, room, scratch, cands);
            self.add_recycled(ctx, tree, i, m, room, cands);
            push_children(heap, pending, cands, i, prob, room);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trie(texts: &[&[u32]], depth: usize) -> Trie {
        let mut t = Trie::new();
        t.allowance = u64::MAX;
        for x in texts {
            t.add_windows(x, depth, 0..x.len());
        }
        t
    }

    fn src<'a>(p: Option<&'a Trie>, h: Option<&'a Trie>, depth: usize) -> Sources<'a> {
        Sources {
            prompt: p,
            history: h,
            prompt_weight: 1.0,
            output_weight: 1.0,
            max_depth: depth,
            suffixes: [&[], &[]],
            history_skip: None,
            recycled: None,
        }
    }

    #[test]
    fn nothing_matched_gives_the_root_alone() {
        let p = trie(&[&[1, 2, 3]], 4);
        let d = src(Some(&p), None, 4).draft(&[9], 8, true);
        assert_eq!(d.tokens, vec![9]);
        assert_eq!(d.parents, vec![-1]);
    }

    #[test]
    fn chain_copies_beyond_max_depth() {
        let text: Vec<u32> = (10..40).collect();
        let p = trie(&[&text], 3);
        let d = src(Some(&p), None, 3).draft(&[10, 11], 20, false);
        assert_eq!(d.tokens, (11..32).collect::<Vec<u32>>());
        assert_eq!(d.parents, (-1..20).collect::<Vec<i32>>());
    }

    #[test]
    fn scores_mix_prompt_and_history() {
        // After [5]: prompt says 6 (x1: 1 / (1 + 1)), history says 7 (x3) and 6 (x1): / (4 + 2).
        let p = trie(&[&[5, 6]], 3);
        let h = trie(&[&[5, 7], &[5, 7], &[5, 7], &[5, 6]], 3);
        let s = src(Some(&p), Some(&h), 3);
        let mut c = Vec::new();
        s.candidates(
            s.match_suffix(&[5]).unwrap(),
            8,
            &mut Scratch::default(),
            &mut c,
        );
        assert_eq!(c[0].token, 6);
        assert!((c[0].score - (0.5 + 1.0 / 6.0) / 2.0).abs() < 1e-12);
        assert_eq!(c[1].token, 7);
        assert!((c[1].score - 0.5 / 2.0).abs() < 1e-12);
        let d = s.draft(&[5], 4, true);
        assert_eq!(&d.tokens[..3], &[5, 6, 7]);
        assert_eq!(&d.parents[..3], &[-1, 0, 0]);
    }

    #[test]
    fn candidates_score_each_tries_listed_children_exactly() {
        let mut x = 7u64;
        let mut rnd = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n) as u32
        };
        // Skewed ids: a few frequent tokens, a long tail, so nodes have many children.
        let text = |len: usize, rnd: &mut dyn FnMut(u64) -> u32| -> Vec<u32> {
            (0..len)
                .map(|_| {
                    let a = rnd(60);
                    a * a / 60
                })
                .collect()
        };
        let pt = text(3000, &mut rnd);
        let ht = text(5000, &mut rnd);
        let p = trie(&[&pt], 4);
        let h = trie(&[&ht], 4);
        for (wp, wo) in [(1.0, 1.0), (1.0, 0.0), (0.0, 2.0), (0.2, 3.0)] {
            let s = Sources {
                prompt: Some(&p),
                history: Some(&h),
                prompt_weight: wp,
                output_weight: wo,
                max_depth: 4,
                suffixes: [&[], &[]],
                history_skip: None,
                recycled: None,
            };
            let mut scratch = Scratch::default();
            for ctx_len in [1usize, 2, 3] {
                for _ in 0..60 {
                    let ctx: Vec<u32> = (0..ctx_len)
                        .map(|_| {
                            let a = rnd(60);
                            a * a / 60
                        })
                        .collect();
                    let Some(st) = s.match_suffix(&ctx) else {
                        continue;
                    };
                    // The rule: a trie with more than TOP_K children offers its TOP_K best
                    // (count desc, token asc); each offered token is scored with both
                    // tries' counts, S and D over all children.
                    let mut offered = std::collections::BTreeSet::new();
                    let mut counts = [std::collections::HashMap::new(), Default::default()];
                    let (mut sums, mut kids) = ([0u64; 2], [0u64; 2]);
                    for (x, (t, w)) in s.tries().into_iter().enumerate() {
                        let Some(t) = t.filter(|_| w > 0.0 && st[x] != NONE) else {
                            continue;
                        };
                        let mut ranked: Vec<(u32, u32)> = Vec::new();
                        for (tok, c, cnt) in t.counted_children(st[x]).filter(|k| k.2 > 0) {
                            counts[x].insert(tok, (cnt, c));
                            sums[x] += u64::from(cnt);
                            kids[x] += 1;
                            ranked.push((cnt, tok));
                        }
                        ranked.sort_unstable_by_key(|&(cnt, tok)| (std::cmp::Reverse(cnt), tok));
                        offered.extend(ranked.iter().take(TOP_K).map(|k| k.1));
                    }
                    let (wp, wo, dens) = s.weights(sums, kids);
                    let mut every: Vec<Cand> = offered
                        .iter()
                        .map(|&tok| {
                            let (cp, np) = counts[0].get(&tok).copied().unwrap_or((0, NONE));
                            let (ch, nh) = counts[1].get(&tok).copied().unwrap_or((0, NONE));
                            Sources::score(&(tok, cp, ch, np, nh), dens, wp, wo, wp + wo)
                        })
                        .collect();
                    every.sort_by(|x, y| y.score.total_cmp(&x.score).then(x.token.cmp(&y.token)));
                    for room in [1usize, 2, 5, 16, 32, 33, 100] {
                        let (mut a, mut b) = (Vec::new(), every.clone());
                        s.candidates(st, room, &mut scratch, &mut a);
                        b.truncate(room);
                        let key = |v: &Vec<Cand>| {
                            v.iter()
                                .map(|c| (c.token, c.score.to_bits(), [c.child[0], c.child[1]]))
                                .collect::<Vec<_>>()
                        };
                        assert_eq!(key(&a), key(&b), "ctx {ctx:?} room {room}");
                    }
                }
            }
        }
        assert!(p.side(crate::trie::ROOT).is_some() && h.side(crate::trie::ROOT).is_some());
    }

    #[test]
    fn shorter_suffixes_back_off_with_the_escape_mass() {
        // After "1 2": 3 (once: 1/2, escape 1/2). After "2": 3, 4, 5 once each (1/6 each);
        // 3 is excluded, 4 and 5 join at 1/2 * 1/6.
        let p = trie(&[&[1, 2, 3, 9, 2, 4, 7, 2, 5]], 3);
        let d = src(Some(&p), None, 3).draft(&[1, 2], 8, true);
        let root_kids: Vec<(u32, f32)> = (1..d.num_nodes())
            .filter(|&i| d.parents[i] == 0)
            .map(|i| (d.tokens[i], d.scores[i]))
            .collect();
        let twelfth = (0.5f64 * (1.0 / 6.0)) as f32;
        assert_eq!(root_kids, vec![(3, 0.5), (4, twelfth), (5, twelfth)]);
        // A one-token match has no shorter suffix: no backoff.
        let d = src(Some(&p), None, 3).draft(&[4], 8, true);
        assert_eq!(d.tokens[1], 7);
        assert!(d.parents[1..].iter().filter(|&&q| q == 0).count() == 1);
    }

    #[test]
    fn longest_suffix_wins_then_falls_back() {
        let p = trie(&[&[1, 2, 3, 9, 2, 3, 4]], 4);
        let s = src(Some(&p), None, 4);
        // "1 2 3" -> 9; "2 3" alone would prefer a tie between 9 and 4.
        assert_eq!(s.draft(&[1, 2, 3], 1, false).tokens, vec![3, 9]);
        // "8 2 3" is unknown, so "2 3" is used: 4 and 9 tie, smaller token first.
        assert_eq!(s.draft(&[8, 2, 3], 1, false).tokens, vec![3, 4]);
    }
}
