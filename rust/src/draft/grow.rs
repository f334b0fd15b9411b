//! Growing a draft: the chain, the best-first tree, backoff at the root, and recycled
//! predictions beside the tries' continuations.

use std::collections::BinaryHeap;

use super::scoring::keep_best;
use super::{
    matched_of, reported_score, Cand, DraftTree, Scratch, Sources, State, BACKOFF_MIN_MASS,
    BACKOFF_PER_LEVEL, FRESH, RECYCLE_MAX_MATCH,
};

/// The tree loop's own buffers, kept apart from `Scratch` because `expand` borrows both at once.
#[derive(Default)]
pub(super) struct TreeBuffers {
    cands: Vec<Cand>,
    probs: Vec<f64>,
    /// Max-heap of `key(prob, seq)`; `pending[seq]` is the candidate pushed as `seq`.
    heap: BinaryHeap<u128>,
    pending: Vec<(u32, Cand)>,
}

/// Heap key of a candidate: probability first (non-negative, so its bits order as the
/// numbers do), then earlier push (`seq` inverted); one integer compare per sift.
#[inline]
pub(super) fn key(prob: f64, seq: usize) -> u128 {
    debug_assert!(prob >= 0.0);
    (u128::from(prob.to_bits()) << 64) | u128::from(u64::MAX - seq as u64)
}

#[inline]
pub(super) fn unkey(k: u128) -> (f64, usize) {
    (
        f64::from_bits((k >> 64) as u64),
        (u64::MAX - k as u64) as usize,
    )
}

impl Sources<'_> {
    /// Continuations of draft node `i` of `tree`: those of its state, or, where that state
    /// has none (a window's end), those of a fresh match on context + path to `i`; at the
    /// root, followed by the backoff levels (see `BACKOFF_MIN_MASS`). Best first, at most
    /// `room`. Returns the length of the n-gram whose continuations they are (0: none).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn expand(
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
                return st.len as usize;
            }
            if !out.is_empty() {
                return st.len as usize;
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
                return st.len as usize;
            }
        }
        self.candidates(st, room, scratch, out);
        let start = scratch.memo_cands.len();
        scratch.memo_cands.extend_from_slice(out);
        let span = start..scratch.memo_cands.len();
        scratch.memo.push((st, room, span));
        st.len as usize
    }

    /// Adds to `out` (the root's candidates: those of `st`, a suffix of `ctx`, whose scores
    /// sum to `mass`; `every`: all of them) those of `st`'s shorter suffixes, tokens already
    /// continuing a longer one (offered or not) excluded, scaled by the escape mass left,
    /// while it is at least `BACKOFF_MIN_MASS`, at most `BACKOFF_PER_LEVEL` per level; keeps
    /// the best `room`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn back_off(
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
        if room == 0 || left < BACKOFF_MIN_MASS || st.len <= 1 {
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
        while left >= BACKOFF_MIN_MASS && cur.len > 1 {
            let Some(next) = self.shorter_taking_part(ctx, cur) else {
                break;
            };
            // Ask for more than `cap` when excluded tokens crowd the top of the list.
            let cap = room.min(BACKOFF_PER_LEVEL);
            let mut want = cap;
            let (next_mass, complete) = loop {
                let (m, all) = self.scored(next, want, true, scratch, &mut lower);
                for c in lower.iter_mut() {
                    c.child.len = next.len + 1;
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
            matched: Vec::with_capacity(cap),
        };
        tree.tokens.push(root);
        tree.parents.push(-1);
        tree.scores.push(1.0);
        tree.matched.push(0);
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
    pub(super) fn recycled_row(
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
    #[inline]
    pub(super) fn add_recycled(
        &self,
        ctx: &[u32],
        tree: &DraftTree,
        i: usize,
        matched: usize,
        room: usize,
        out: &mut Vec<Cand>,
    ) {
        // Inlined, so that with recycling off a draft pays one test per node for it.
        if self.recycled.is_some() && matched <= RECYCLE_MAX_MATCH {
            self.add_recycled_row(ctx, tree, i, room, out);
        }
    }

    /// `add_recycled`'s work, where recycling is on and the match is short enough.
    fn add_recycled_row(
        &self,
        ctx: &[u32],
        tree: &DraftTree,
        i: usize,
        room: usize,
        out: &mut Vec<Cand>,
    ) {
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
    pub(super) fn grow(
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
                tree.scores.push(reported_score(p));
                tree.matched.push(matched_of(&best));
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
            tree.scores.push(reported_score(prob));
            tree.matched.push(matched_of(&cand));
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
