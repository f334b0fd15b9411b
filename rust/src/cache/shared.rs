//! The state background jobs share with the cache, and eviction across namespaces: a CLOCK
//! over namespaces, then over the chosen one's history.

use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use crate::evict::Budget;
use crate::pool::Job;
use crate::recycle::Recycled;
use std::sync::mpsc::Sender;

use super::config::{Config, CHUNK_TOKENS, NAMESPACE_SHARE, SWEEP_VISITS};
use super::corpus::Corpus;
use super::indexing::Target;
use super::locks::{lock, read, write};
use super::namespace::{Namespace, NsUse};
use super::request::Cursors;

/// Full CLOCK revolutions `make_room` tries before giving up (counts are u32: 32 halvings
/// reach 0, then a few more passes free parents that became leaves).
pub(super) const MAX_PASSES: usize = 48;

/// Namespaces `make_room` passes over (recently used ones get a second chance) before it
/// falls back to the requester's own history: the cost of one eviction does not grow with
/// the number of namespaces.
pub(super) const MAX_LOOKS: usize = 64;

/// Ring entries a new namespace's creation looks at, dropping the unused empty ones: the
/// ring stays within a small factor of the live namespaces without any sweep over them.
pub(super) const TIDY_LOOKS: usize = 2;

/// Budget nodes held by an operation in progress: given back if it unwinds before handing
/// them to a trie (`std::mem::forget` once it has).
pub(super) struct Held<'a>(pub(super) &'a Budget, pub(super) u64);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.release(self.1);
    }
}

/// State shared with background jobs.
pub(super) struct Shared {
    pub(super) cfg: Config,
    pub(super) budget: Arc<Budget>,
    /// The pool's queue (with background indexing), for compactions.
    pub(super) background: Option<Mutex<Sender<Job>>>,
    pub(super) namespaces: RwLock<FxHashMap<String, Arc<Namespace>>>,
    /// Every namespace in eviction order (CLOCK over namespaces: the front is the next
    /// candidate); entries of dropped namespaces are discarded when they reach the front.
    pub(super) ring: Mutex<VecDeque<Arc<Namespace>>>,
    /// Logical clock of namespace use.
    pub(super) tick: AtomicU64,
    pub(super) hits: AtomicU64,
    pub(super) misses: AtomicU64,
    pub(super) evicted: AtomicU64,
    pub(super) truncated_prompts: AtomicU64,
    pub(super) in_flight: AtomicUsize,
    pub(super) op_seq: AtomicU64,
    /// Ids of namespaces created so far.
    pub(super) ns_seq: AtomicU64,
    /// The target's recycled predictions, all namespaces' (keyed by namespace id). Its lock
    /// is taken last (a draft reads it under its trie read locks) and writers hold it alone.
    pub(super) recycled: RwLock<Recycled>,
    /// The published corpora (`corpus`), in the order they were added, and how many (read
    /// without the lock by drafts, which skip corpora entirely while there are none).
    pub(super) corpora: RwLock<Vec<Arc<Corpus>>>,
    pub(super) corpus_count: AtomicUsize,
    /// A `CorpusBuild` exists (one at a time).
    pub(super) building_corpus: AtomicBool,
}

/// Marks an operation as running (for the exact checks of `check_invariants`).
pub(super) struct Busy<'a>(pub(super) &'a Shared);

impl<'a> Busy<'a> {
    pub(super) fn new(s: &'a Shared) -> Self {
        s.in_flight.fetch_add(1, Ordering::AcqRel);
        Busy(s)
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.op_seq.fetch_add(1, Ordering::AcqRel);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Shared {
    pub(super) fn now(&self) -> u64 {
        self.tick.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Marks `ns` as used now (it moves to the back of the eviction order).
    pub(super) fn touch(&self, ns: &Namespace) {
        ns.used_at.store(self.now(), Ordering::Relaxed);
    }

    /// A use of namespace `name`, created if new. O(1) in the number of namespaces.
    pub(super) fn use_namespace(&self, name: &str) -> NsUse {
        let now = self.now();
        let take = |ns: &Arc<Namespace>| {
            // Under the map lock: `try_drop` (which takes it for writing) sees this use.
            ns.users.fetch_add(1, Ordering::AcqRel);
            ns.used_at.store(now, Ordering::Relaxed);
            NsUse(Arc::clone(ns))
        };
        if let Some(ns) = read(&self.namespaces).get(name) {
            return take(ns);
        }
        if let Some(max) = self.cfg.max_namespaces() {
            self.shed_namespaces(max.saturating_sub(1));
        }
        let mut all = write(&self.namespaces);
        if let Some(ns) = all.get(name) {
            return take(ns);
        }
        let id = self.ns_seq.fetch_add(1, Ordering::Relaxed);
        let ns = Arc::new(Namespace::new(name, id, now));
        all.insert(name.to_owned(), Arc::clone(&ns));
        let got = take(&ns);
        drop(all);
        lock(&self.ring).push_back(ns);
        self.tidy();
        got
    }

    /// Under a byte budget: drops unused namespaces whole, in ring order, until at most
    /// `keep` remain (looking at no more than `2 * MAX_LOOKS`; namespaces in use stay, each
    /// with its live requests).
    fn shed_namespaces(&self, keep: usize) {
        for _ in 0..2 * MAX_LOOKS {
            if read(&self.namespaces).len() <= keep {
                return;
            }
            let Some(ns) = lock(&self.ring).pop_front() else {
                return;
            };
            if ns.dropped.load(Ordering::Acquire) {
                continue;
            }
            let dropped = self.try_drop(&ns, u64::MAX);
            if dropped > 0 {
                self.evicted.fetch_add(dropped - 1, Ordering::Relaxed);
            } else if !ns.dropped.load(Ordering::Acquire) {
                self.requeue(ns);
            }
        }
    }

    /// Looks at the first `TIDY_LOOKS` ring entries: stale ones and unused empty
    /// namespaces leave it, the others go to the back.
    pub(super) fn tidy(&self) {
        for _ in 0..TIDY_LOOKS {
            let Some(ns) = lock(&self.ring).pop_front() else {
                return;
            };
            if ns.dropped.load(Ordering::Acquire) {
                continue;
            }
            let dropped = read(&ns.history).nodes() == 0 && self.try_drop(&ns, 0) > 0;
            if !dropped && !ns.dropped.load(Ordering::Acquire) {
                self.requeue(ns);
            }
        }
    }

    pub(super) fn requeue(&self, ns: Arc<Namespace>) {
        ns.queued_at.store(self.now(), Ordering::Relaxed);
        lock(&self.ring).push_back(ns);
    }

    /// Drops `ns` (leaving the name map, its history's nodes back to the budget) if it is
    /// unused and holds at most `max_nodes` nodes. Returns 1 + the nodes released if it
    /// was dropped, 0 if not.
    pub(super) fn try_drop(&self, ns: &Arc<Namespace>, max_nodes: u64) -> u64 {
        let mut all = write(&self.namespaces);
        let mine = all.get(&ns.name).is_some_and(|n| Arc::ptr_eq(n, ns));
        if !mine || ns.users.load(Ordering::Acquire) != 0 {
            return 0;
        }
        // Never wait for the history under the map lock (every lookup waits on that one): a
        // namespace being written, saved or compacted right now is simply not dropped this
        // time.
        let _writing = match ns.writer.try_lock() {
            Ok(w) => w,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return 0,
        };
        let mut h = match ns.history.try_write() {
            Ok(h) => h,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return 0,
        };
        let nodes = h.nodes();
        if nodes > max_nodes {
            return 0;
        }
        all.remove(&ns.name);
        ns.dropped.store(true, Ordering::Release);
        let old = std::mem::take(&mut *h);
        drop(h);
        drop(all);
        self.budget.release(old.nodes() + old.allowance);
        drop(old);
        1 + nodes
    }

    /// Frees shared-history nodes until `want` are freed or nothing more can go, for a
    /// write that `requester`'s history or a request of it needs room for. Order: the
    /// requester's own history if it holds more than its share; then other namespaces in
    /// CLOCK order (an unused one small enough goes whole, a recently used one is passed
    /// over once); then the requester's own history; then other namespaces, used or not.
    /// Looks at no more than `2 * MAX_LOOKS` namespaces, however many exist.
    pub(super) fn make_room(&self, want: u64, requester: Option<&Namespace>) -> u64 {
        let mut freed = 0;
        let share = self.budget.capacity() / NAMESPACE_SHARE;
        if let Some(x) = requester {
            if read(&x.history).nodes() > share {
                freed += self.evict_in(x, want);
            }
        }
        for forced in [false, true] {
            let looks = lock(&self.ring).len().min(MAX_LOOKS);
            for _ in 0..looks {
                if freed >= want {
                    break;
                }
                let Some(ns) = lock(&self.ring).pop_front() else {
                    break;
                };
                if ns.dropped.load(Ordering::Acquire) {
                    continue;
                }
                let mine = requester.is_some_and(|x| std::ptr::eq(x, &*ns));
                let nodes = read(&ns.history).nodes();
                let recent =
                    ns.used_at.load(Ordering::Relaxed) > ns.queued_at.load(Ordering::Relaxed);
                if mine || nodes == 0 || (recent && !forced) {
                    if !(nodes == 0 && !mine && self.try_drop(&ns, 0) > 0) {
                        self.requeue(ns);
                    }
                    continue;
                }
                // Only a namespace small enough to go whole is tried (its history write lock
                // is not waited for under the map lock).
                if nodes <= want - freed {
                    let whole = self.try_drop(&ns, want - freed);
                    if whole > 0 {
                        freed += whole - 1;
                        continue;
                    }
                }
                // Back in the ring even if the sweep panics (a bug): a namespace out of the
                // ring could never be evicted or dropped again.
                let swept = catch_unwind(AssertUnwindSafe(|| self.evict_in(&ns, want - freed)));
                self.requeue(ns);
                freed += swept.unwrap_or_else(|e| std::panic::resume_unwind(e));
            }
            if freed < want && !forced {
                if let Some(x) = requester {
                    freed += self.evict_in(x, want - freed);
                }
            }
        }
        self.evicted.fetch_add(freed, Ordering::Relaxed);
        freed
    }

    /// CLOCK-sweeps `ns`'s history until `want` nodes are freed or it is empty (at most
    /// `MAX_PASSES` revolutions, one namespace lock held for `SWEEP_VISITS` slots at a
    /// time), then compacts it if eviction left more free slots than live nodes, so a
    /// shrunk history gives its memory back. A history that a compaction or a save holds
    /// is passed over (its writers would wait for them). Returns the nodes freed.
    pub(super) fn evict_in(&self, ns: &Namespace, want: u64) -> u64 {
        let mut freed = 0;
        for _ in 0..MAX_PASSES {
            let slots = read(&ns.history).arena.slots();
            let mut visited = 0u32;
            while visited < slots && freed < want {
                let Some(writing) = ns.writing_unless_held() else {
                    return freed;
                };
                let f = write(&ns.history).sweep(SWEEP_VISITS.min(slots - visited), want - freed);
                drop(writing);
                self.budget.release(f);
                freed += f;
                visited = visited.saturating_add(SWEEP_VISITS);
            }
            if freed >= want || read(&ns.history).nodes() == 0 {
                break;
            }
        }
        self.compact_soon(ns);
        freed
    }

    /// Has `ns`'s history compacted if eviction left it more free slots than live nodes
    /// (`Namespace::compact_history`): by a pool thread when the cache has one (the step
    /// whose reservation evicted does not pay for it), else here.
    pub(super) fn compact_soon(&self, ns: &Namespace) {
        if !ns.wants_compaction() {
            return;
        }
        let Some(tx) = &self.background else {
            ns.compact_history();
            return;
        };
        // The job needs its own handle on the namespace: the one in the name map.
        let Some(ns) = read(&self.namespaces)
            .get(&ns.name)
            .filter(|x| std::ptr::eq(&***x, ns))
            .cloned()
        else {
            return; // dropped meanwhile: nothing to give back
        };
        if ns.compaction_queued.swap(true, Ordering::AcqRel) {
            return;
        }
        let job = move || {
            ns.compaction_queued.store(false, Ordering::Release);
            ns.compact_history();
        };
        if let Err(job) = lock(tx).send(Box::new(job)) {
            (job.0)(); // the pool is gone (the cache is being dropped)
        }
    }

    /// Reserves up to `need` nodes for a write of `requester`'s, evicting shared history if
    /// the budget is short.
    pub(super) fn reserve(&self, need: u64, requester: &Namespace) -> u64 {
        let mut got = self.budget.reserve_up_to(need);
        if got < need {
            let slack = (self.budget.capacity() / 64).max(need - got);
            self.make_room(slack, Some(requester));
            got += self.budget.reserve_up_to(need - got);
        }
        got
    }

    /// Indexes every window of `text` into `ns`'s history, `CHUNK_TOKENS` windows per lock.
    pub(super) fn add_history(&self, ns: &Namespace, text: &[u32]) {
        self.add_history_part(ns, text, 0..text.len());
    }

    /// Counts into `ns`'s history the n-grams of `text` that end at a token in `part`
    /// (parts that tile the text count exactly what the whole text does).
    pub(super) fn add_history_part(
        &self,
        ns: &Namespace,
        text: &[u32],
        part: std::ops::Range<usize>,
    ) {
        let depth = self.cfg.max_depth;
        let mut cur = Cursors::stale();
        let mut s = part.start;
        while s < part.end {
            let end = (s + CHUNK_TOKENS).min(part.end);
            // The n-grams ending at each token, as `extend` counts them (same counts as all
            // windows of the text, and suffix links come for free).
            let before = &text[s.saturating_sub(depth - 1)..s];
            self.count_into(ns, Target::History, &mut cur, before, &text[s..end]);
            s = end;
        }
    }
}
