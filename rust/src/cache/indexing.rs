//! Counting n-grams into a trie: the history's and a request's own, in bounded chunks under
//! budget reservations; prompt builds.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::arena::NONE;
use crate::trie::{SortedWindows, Trie, ROOT};

use super::config::{CHUNK_TOKENS, PROMPT_SHARE};
use super::locks::{panic_message, write};
use super::namespace::Namespace;
use super::request::{Cursors, OwnTrie, PromptSlot, ReqState};
use super::shared::{Held, Shared};

/// Windows a prompt builder indexes between budget reservations.
pub(super) const BUILD_CHUNK: usize = 1024;

/// Tokens a request may leave for its namespace's history while a compaction or a save holds
/// the history's writers off; past it, its steps wait.
pub(super) const PENDING_TOKENS: usize = 4096;

/// Where `count_into` counts.
#[derive(Clone, Copy)]
pub(super) enum Target<'a> {
    /// A request's own trie.
    Own(&'a RwLock<Trie>),
    /// The namespace's history (written only with the namespace's writer right).
    History,
    /// The history, unless a compaction or a save holds its writers off: then nothing is
    /// counted (a step's tokens, which wait for a later step).
    HistoryUnlessHeld,
}

/// Feeds `f` the chunks of `text` (which follows `before`) with the context before each.
fn in_chunks(text: &[u32], mut before: Vec<u32>, keep: usize, mut f: impl FnMut(&[u32], &[u32])) {
    for chunk in text.chunks(CHUNK_TOKENS) {
        f(&before, chunk);
        before.extend_from_slice(chunk);
        before.drain(..before.len().saturating_sub(keep));
    }
}

impl Shared {
    /// Counts into `target` the n-grams ending at each token of `chunk` (at most
    /// `CHUNK_TOKENS`), which follows `before` in the text, under one write-lock hold and a
    /// budget reservation of what it may need. Returns the nodes it created, or `None` if
    /// `HistoryUnlessHeld` found the history held.
    pub(super) fn count_into(
        &self,
        ns: &Namespace,
        target: Target<'_>,
        cur: &mut Cursors,
        before: &[u32],
        chunk: &[u32],
    ) -> Option<u64> {
        let depth = self.cfg.max_depth;
        // Before the writer right: making room may sweep this very history.
        let got = self.reserve((chunk.len() * depth + depth * depth) as u64, ns);
        let (_writing, trie) = match target {
            Target::Own(t) => (None, t),
            Target::History => (Some(ns.writing()), &ns.history),
            Target::HistoryUnlessHeld => match ns.writing_unless_held() {
                Some(w) => (Some(w), &ns.history),
                None => {
                    self.budget.release(got);
                    return None;
                }
            },
        };
        let mut t = write(trie);
        t.allowance = got;
        // The unused reservation goes back even if counting panics (a bug, reported to the
        // caller), so no panic can leak capacity.
        let counted = catch_unwind(AssertUnwindSafe(|| {
            count_ngrams(&mut t, cur, before, chunk, depth);
        }));
        let unused = std::mem::take(&mut t.allowance);
        drop(t);
        self.budget.release(unused);
        if let Err(e) = counted {
            std::panic::resume_unwind(e);
        }
        Some(got - unused)
    }

    /// `count_into` the request's own trie, while own-trie outputs fit their share of the
    /// capacity; past it, this request's outputs reach only the shared history (and the
    /// cursors are rebuilt from `before` once there is room again).
    pub(super) fn count_own(
        &self,
        ns: &Namespace,
        own: &OwnTrie,
        cur: &mut Cursors,
        before: &[u32],
        chunk: &[u32],
    ) {
        if self.cfg.own_weight == 0.0 {
            return; // drafts never read the request's own trie
        }
        if !self.budget.own_outputs_fit() {
            cur.epoch = u64::MAX;
            return;
        }
        let added = self
            .count_into(ns, Target::Own(&own.trie), cur, before, chunk)
            .unwrap_or(0);
        own.outputs.fetch_add(added, Ordering::Relaxed);
        self.budget.note_own_outputs(added as i64);
    }

    /// Counts the tokens that arrived while `own` was being built into it (if any).
    pub(super) fn catch_up(&self, ns: &Namespace, own: &OwnTrie, st: &mut ReqState) {
        if st.unindexed.is_empty() {
            return;
        }
        let text = std::mem::take(&mut st.unindexed);
        let before = std::mem::take(&mut st.unindexed_before);
        in_chunks(&text, before, self.cfg.max_depth - 1, |b, c| {
            self.count_own(ns, own, &mut st.own, b, c)
        });
    }

    /// Counts a step's `chunk` (at most `CHUNK_TOKENS`, following `st.tail`) into the
    /// namespace's history, after the tokens left for it earlier. While a compaction or a
    /// save holds the history's writers off, leaves it for a later step instead (up to
    /// `PENDING_TOKENS`; past that the step waits), so the step does not wait for them; its
    /// drafts meanwhile walk the history from the root (its cursors there are stale).
    pub(super) fn count_history(&self, ns: &Namespace, st: &mut ReqState, chunk: &[u32]) {
        if st.history_pending.is_empty() {
            let target = Target::HistoryUnlessHeld;
            if self
                .count_into(ns, target, &mut st.history, &st.tail, chunk)
                .is_some()
            {
                return;
            }
            let keep = self.cfg.max_depth - 1;
            st.history_pending_before = st.tail[st.tail.len().saturating_sub(keep)..].to_vec();
            st.history.epoch = u64::MAX;
            st.history_pending.extend_from_slice(chunk);
            return;
        }
        st.history_pending.extend_from_slice(chunk);
        let wait = st.history_pending.len() > PENDING_TOKENS;
        self.flush_history(ns, st, wait);
    }

    /// Counts the tokens a request left for its namespace's history (if any); unless
    /// `wait`, stops where a compaction or a save holds the writers off, and leaves the
    /// rest for later.
    fn flush_history(&self, ns: &Namespace, st: &mut ReqState, wait: bool) {
        let text = std::mem::take(&mut st.history_pending);
        let mut before = std::mem::take(&mut st.history_pending_before);
        let keep = self.cfg.max_depth - 1;
        let target = if wait {
            Target::History
        } else {
            Target::HistoryUnlessHeld
        };
        let mut done = 0;
        for chunk in text.chunks(CHUNK_TOKENS) {
            if self
                .count_into(ns, target, &mut st.history, &before, chunk)
                .is_none()
            {
                st.history_pending = text[done..].to_vec();
                st.history_pending_before = before;
                st.history.epoch = u64::MAX;
                return;
            }
            before.extend_from_slice(chunk);
            before.drain(..before.len().saturating_sub(keep));
            done += chunk.len();
        }
    }

    /// Counts `text`, which follows `before`, into the namespace's history.
    pub(super) fn count_history_later(
        &self,
        ns: &Namespace,
        cur: &mut Cursors,
        text: &[u32],
        before: Vec<u32>,
    ) {
        in_chunks(text, before, self.cfg.max_depth - 1, |b, c| {
            self.count_into(ns, Target::History, cur, b, c);
        });
    }

    /// Builds the own trie of `text`; stops early (truncated) when the budget is spent
    /// even after evicting shared history, or when the request was finished meanwhile.
    pub(super) fn build_prompt(&self, ns: &Namespace, text: &[u32], slot: &PromptSlot) -> OwnTrie {
        let depth = self.cfg.max_depth;
        let mut p = OwnTrie {
            trie: RwLock::new(Trie::new()),
            budget: Arc::clone(&self.budget),
            truncated: false,
            outputs: AtomicU64::new(0),
        };
        if self.cfg.own_weight == 0.0 {
            // Drafts never read it: an empty trie, so no capacity goes to unread nodes.
            return p;
        }
        // At most this request's share of the capacity (`PROMPT_SHARE`).
        let most = (self.budget.capacity() / PROMPT_SHARE).max(1);
        // Fast path: the exact node count is known before any node exists, so reserve it.
        let sw = SortedWindows::new(text, depth);
        let got = if sw.nodes <= most {
            self.reserve(sw.nodes, ns)
        } else {
            0
        };
        if got == sw.nodes {
            // Released if the build panics (the trie's own drop releases its nodes after).
            let held = Held(&self.budget, got);
            p.trie = RwLock::new(Trie::from_sorted(text, depth, &sw));
            std::mem::forget(held);
            return p;
        }
        drop(sw);
        // Past its share, or short of budget even after eviction: index windows in text
        // order until its share or the budget is spent.
        let t = p.trie.get_mut().unwrap_or_else(|e| e.into_inner());
        t.allowance = got;
        let mut s = 0;
        while s < text.len() && !slot.cancel.load(Ordering::Relaxed) {
            let end = (s + BUILD_CHUNK).min(text.len());
            let need = ((end - s) * depth) as u64;
            if t.allowance < need {
                let room = most.saturating_sub(t.nodes() + t.allowance);
                t.allowance += self.reserve((need - t.allowance).min(room), ns);
            }
            let stop = t.add_windows(text, depth, s..end);
            if stop < end {
                p.truncated = true;
                self.truncated_prompts.fetch_add(1, Ordering::Relaxed);
                break;
            }
            s = end;
        }
        self.budget.release(std::mem::take(&mut t.allowance));
        p
    }

    pub(super) fn run_build(&self, ns: &Namespace, text: &[u32], slot: &PromptSlot) {
        if slot.cancel.load(Ordering::Relaxed) {
            // Finished (or its cache dropped) while queued: nobody will draft from it.
            slot.set(Err("cancelled before it started".into()));
            return;
        }
        let r = catch_unwind(AssertUnwindSafe(|| self.build_prompt(ns, text, slot)));
        slot.set(r.map_err(|e| panic_message(&e)));
    }
}

/// Counts in `t` every n-gram (up to `depth` tokens) ending at a token of `chunk`, which
/// follows `before` (at least the text's last `depth - 1` tokens, or all of it) through the
/// cursors `cur`. If the allowance runs out, some n-grams are not stored and `cur` is left
/// stale (rebuilt on the next call).
pub(super) fn count_ngrams(
    t: &mut Trie,
    cur: &mut Cursors,
    before: &[u32],
    chunk: &[u32],
    depth: usize,
) {
    let keep = depth - 1;
    let mut ok = true;
    let fresh = cur.epoch == t.epoch;
    // Stale until the chunk is done: a panic midway must not leave cursors that look current.
    cur.epoch = u64::MAX;
    if !fresh {
        // Rebuild: the suffixes of the context so far, created as structure (count 0): they
        // are prefixes of the n-grams about to be counted.
        cur.nodes.clear();
        let n = before.len();
        for len in 1..=keep.min(n) {
            let mut node = ROOT;
            for &x in &before[n - len..] {
                node = t.child_or_insert(node, x);
                if node == NONE {
                    break;
                }
            }
            if node == NONE {
                ok = false;
                break;
            }
            cur.nodes.push(node);
        }
    }
    let mut next = std::mem::take(&mut cur.next);
    for &x in chunk {
        next.clear();
        for &c in &cur.nodes {
            t.arena.prefetch(t.node(c).first_child);
        }
        let first = t.count_child(ROOT, x, ROOT);
        if first == NONE {
            ok = false;
        } else {
            next.push(first);
            // The n-grams ending at `x`, shortest first: each one's suffix link is the
            // previous one.
            let mut prev = first;
            for &c in &cur.nodes {
                let child = t.count_child(c, x, prev);
                if child == NONE {
                    ok = false;
                    break;
                }
                prev = child;
                if next.len() < keep {
                    next.push(child);
                }
            }
        }
        std::mem::swap(&mut cur.nodes, &mut next);
    }
    cur.next = next;
    cur.epoch = if ok { t.epoch } else { u64::MAX };
}
