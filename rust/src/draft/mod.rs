//! Drafting: suffix matching, child scoring, the greedy chain and the best-first tree.
//!
//! - `matching`: the state of the context's longest suffix the tries continue
//! - `scoring`: a state's candidate continuations and their scores
//! - `mix`: several sources' drafts (a request's and its corpora's) mixed into one
//! - `grow`: the chain and the best-first tree, backoff at the root, recycled predictions
//!
//! This file holds what they share: the state, the sources a draft reads, and the tree.
//!
//! A *state* is the pair (own-trie node, history-trie node) of one n-gram `p` (either may be
//! `NONE`). The score of child token `t` of `p` is
//!
//! ```text
//! score(t) = (w_own * c_O(p,t) / (S_O(p) + D_O(p)) + w_hist * c_H(p,t) / (S_H(p) + D_H(p)))
//!            / (w_own + w_hist)
//! ```
//!
//! where O is the request's own trie (its prompt and outputs), H the namespace's shared
//! history, `w_own` / `w_hist` the `own_weight` / `history_weight` knobs,
//! `c_X(p,t)` is the count of n-gram `p+t` in trie X, `S_X(p)` the sum of the positive
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

mod grow;
mod matching;
mod mix;
mod scoring;
#[cfg(test)]
mod tests;

pub use mix::mix;

use crate::arena::NONE;
use crate::recycle::Recycled;
use crate::trie::{Trie, SIDE_AT};

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

/// Which trie a per-trie pair holds first: the request's own text (its prompt and outputs),
/// then the namespace's shared history.
pub const OWN: usize = 0;
pub const HISTORY: usize = 1;

/// Where one n-gram sits in each trie: its node in the request's own trie and in the shared
/// history (`NONE` where that trie does not continue it), and its length in tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct State {
    /// Indexed by `OWN` / `HISTORY`.
    pub nodes: [u32; 2],
    pub len: u32,
}

pub(super) const EMPTY: State = State {
    nodes: [NONE, NONE],
    len: 0,
};
/// The child state of a candidate no trie continues (a recycled prediction): expanding it
/// matches the context + path afresh.
pub(super) const FRESH: State = State {
    nodes: [NONE, NONE],
    len: u32::MAX,
};

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
    pub own: Option<&'a Trie>,
    pub history: Option<&'a Trie>,
    pub own_weight: f64,
    pub history_weight: f64,
    pub max_depth: usize,
    /// Per trie (own, history), its nodes of the context's suffixes (`[k-1]`: the k-token
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

/// The least score a draft node reports. A node's score is the product of the scores on its
/// path, which underflows f32 (and f64 in long single-branch drafts) a few hundred nodes
/// deep: reported scores stay in (0, 1], floored here (the ranking uses the unfloored
/// products).
pub const MIN_SCORE: f32 = f32::MIN_POSITIVE;

/// A path score as a draft reports it: as f32, at least `MIN_SCORE`.
pub(crate) fn reported_score(p: f64) -> f32 {
    (p as f32).max(MIN_SCORE)
}

/// A draft tree: node 0 is the root (last context token), `parents[0] == -1`.
#[derive(Debug, Clone, PartialEq)]
pub struct DraftTree {
    pub tokens: Vec<u32>,
    pub parents: Vec<i32>,
    pub scores: Vec<f32>,
    /// Per node, the length in tokens of the n-gram (a suffix of context + path to its
    /// parent) whose continuation the node is: 0 at the root and for a recycled prediction
    /// no trie continues. A long match is a copy, far likelier than its score says
    /// (Witten-Bell scores a once-seen continuation 1/2 however long the match): the
    /// acceptance calibration reads both (`lookahead.calibration`).
    pub matched: Vec<u8>,
}

/// A node's `matched` value from the state of its candidate: one less than the child
/// state's length (0 for a fresh, recycled candidate), capped to fit a `u8`.
#[inline]
pub(crate) fn matched_of(c: &Cand) -> u8 {
    if c.child == FRESH {
        0
    } else {
        c.child.len.saturating_sub(1).min(u32::from(u8::MAX)) as u8
    }
}

impl DraftTree {
    pub fn num_nodes(&self) -> usize {
        self.tokens.len()
    }

    /// Drops the nodes whose ids are `vocab` or more (a history shared with a model of another
    /// vocabulary) or that lie more than `max_depth` below the root (draft tokens the output
    /// has no room for), with their descendants; the others keep their order (best-first, a
    /// parent before its children), their parents renumbered. The root always stays.
    pub fn prune(&mut self, vocab: u64, max_depth: usize) {
        let n = self.tokens.len();
        // (new index, depth) of each kept node, by its old index; u32::MAX: dropped.
        let mut kept: Vec<(u32, usize)> = Vec::with_capacity(n);
        kept.push((0, 0));
        let mut k = 1;
        for i in 1..n {
            let p = kept[self.parents[i] as usize];
            if u64::from(self.tokens[i]) < vocab && p.0 != u32::MAX && p.1 < max_depth {
                kept.push((k as u32, p.1 + 1));
                self.tokens[k] = self.tokens[i];
                self.parents[k] = p.0 as i32;
                self.scores[k] = self.scores[i];
                self.matched[k] = self.matched[i];
                k += 1;
            } else {
                kept.push((u32::MAX, 0));
            }
        }
        self.tokens.truncate(k);
        self.parents.truncate(k);
        self.scores.truncate(k);
        self.matched.truncate(k);
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
    pub(super) raw: Vec<scoring::Row>,
    /// Fresh-match states already scored: (state, room asked, best-first list).
    pub(super) memo: Vec<(State, usize, std::ops::Range<usize>)>,
    /// The memo's lists, back to back.
    pub(super) memo_cands: Vec<Cand>,
    pub(super) buf: Vec<u32>,
    pub(super) lower: Vec<Cand>,
    pub(super) excl: Vec<u32>,
    pub(super) partial: Vec<State>,
}
