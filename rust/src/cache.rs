//! The cache: requests, namespaces, prompt indexing, output streaming, drafting, eviction.
//!
//! Concurrency: each namespace's shared history is one `Trie` behind an `RwLock`. Writers
//! (`extend`, `add_history`, prompt merges, eviction sweeps) hold the write lock for bounded
//! chunks only (`CHUNK_TOKENS` tokens or `SWEEP_VISITS` slots), so a draft never waits long.
//! A request's own trie is built from its prompt once (in the background by default), then
//! grows with that request's outputs; only that request's own calls wait for it or lock it.
//! Lock order, never reversed: request state -> the request's prompt slot -> the request's
//! own trie -> one namespace lock (a draft reads its own trie, then the history; `extend`
//! writes one trie at a time). Budget reservations, which may evict history, happen before a
//! trie lock is taken; nothing holding a namespace lock takes another lock but the
//! recycled-prediction table's (read, last, by drafts; its writers hold it alone). The name map of
//! namespaces comes before any history lock (and dropping a namespace only tries that lock,
//! never waits for it under the map lock); the eviction ring's mutex is held alone.

use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::arena::NONE;
use crate::draft::{DraftTree, RecycleView, Sources};
use crate::error::{Error, Result};
use crate::evict::Budget;
use crate::pool::Pool;
use crate::recycle::{Recycled, ALONE, MAX_WIDTH};
use crate::trie::{SortedWindows, Trie, ROOT};

/// Tokens of one write-lock hold in `extend` / `add_history` / prompt merges.
pub const CHUNK_TOKENS: usize = 64;
/// Slots one eviction step visits per write-lock hold.
pub const SWEEP_VISITS: u32 = 4096;
/// Windows a prompt builder indexes between budget reservations.
const BUILD_CHUNK: usize = 1024;
/// Full CLOCK revolutions `make_room` tries before giving up (counts are u32: 32 halvings
/// reach 0, then a few more passes free parents that became leaves).
const MAX_PASSES: usize = 48;
/// Largest `max_depth` accepted.
pub const MAX_DEPTH: usize = 64;
/// Largest draft budget accepted.
pub const MAX_BUDGET: usize = 1 << 16;
/// Most background indexing threads: more only compete for the cores and the capacity.
pub const MAX_INDEX_THREADS: usize = 256;
/// Largest `prompt_weight` / `output_weight`: scores stay finite (`weight * count` and the
/// two weights' sum) for any count.
pub const MAX_WEIGHT: f64 = 1e6;
/// Longest namespace name, in bytes (what a save file can hold).
pub const MAX_NAMESPACE_BYTES: usize = 1 << 20;
/// A namespace holding more than `1 / NAMESPACE_SHARE` of the capacity makes room for its
/// own writes by evicting its own history first: one noisy tenant leaves the others at
/// least half of the capacity.
pub const NAMESPACE_SHARE: u64 = 2;
/// One request's prompt trie takes at most `1 / PROMPT_SHARE` of the capacity (a longer
/// prompt is indexed up to there): one huge prompt cannot evict every tenant's history.
pub const PROMPT_SHARE: u64 = 4;
/// Namespaces `make_room` passes over (recently used ones get a second chance) before it
/// falls back to the requester's own history: the cost of one eviction does not grow with
/// the number of namespaces.
const MAX_LOOKS: usize = 64;
/// Free slots a history arena may keep beyond its live nodes before it is compacted.
const COMPACT_SLACK: u64 = 64;
/// Ring entries a new namespace's creation looks at, dropping the unused empty ones: the
/// ring stays within a small factor of the live namespaces without any sweep over them.
const TIDY_LOOKS: usize = 2;
/// The default `history_skip`: a 3-6 token match in the shared history is left out of the
/// draft (simulator, B = 16: 2.772 -> 2.794 tokens per step, no category down; repeated
/// requests still copy their whole earlier answer; research/README.md).
pub const DEFAULT_HISTORY_SKIP: Option<(usize, usize)> = Some((3, 6));

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub max_depth: usize,
    pub capacity_nodes: u64,
    pub prompt_weight: f64,
    pub output_weight: f64,
    pub keep_prompt_as_history: bool,
    pub background_indexing: bool,
    /// Background indexing threads (0: min(available cores, 4)).
    pub index_threads: usize,
    /// Context lengths `lo..=hi` at which drafts do not consult the shared history (`None`:
    /// at every length); see `Sources::history_answers`.
    pub history_skip: Option<(usize, usize)>,
    /// Recycled predictions kept per key: the target's top-`recycle_k` next tokens handed to
    /// `extend_predicted` (0: none kept, drafts come from the tries only).
    pub recycle_k: usize,
    /// Keys the recycled-prediction table holds at most, over all namespaces (its memory is
    /// at most about `recycle_slots * (8 * recycle_k + 75)` bytes, once full).
    pub recycle_slots: usize,
    /// A recycled token's score is `recycle_weight * p` (see `draft::RecycleView`).
    pub recycle_weight: f64,
}

/// Default `recycle_slots`: 2**18 keys (about 36 MB at `recycle_k = 8`, once full).
pub const DEFAULT_RECYCLE_SLOTS: usize = 1 << 18;
/// Largest `recycle_slots` accepted.
pub const MAX_RECYCLE_SLOTS: usize = 1 << 28;

impl Default for Config {
    fn default() -> Self {
        Config {
            max_depth: 12,
            capacity_nodes: 4_000_000,
            prompt_weight: 4.0,
            output_weight: 1.0,
            keep_prompt_as_history: false,
            background_indexing: true,
            index_threads: 0,
            history_skip: DEFAULT_HISTORY_SKIP,
            recycle_k: 0,
            recycle_slots: DEFAULT_RECYCLE_SLOTS,
            recycle_weight: 0.5,
        }
    }
}

impl Config {
    /// Whether recycled predictions are kept (and drafts read them).
    pub fn recycles(&self) -> bool {
        self.recycle_k > 0 && self.recycle_slots > 0
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidInput(m));
        if !(2..=MAX_DEPTH).contains(&self.max_depth) {
            return bad(format!(
                "max_depth must be in 2..={MAX_DEPTH}, got {}",
                self.max_depth
            ));
        }
        if self.capacity_nodes < 1 || self.capacity_nodes > u64::from(u32::MAX - 2) {
            return bad(format!(
                "capacity_nodes must be in 1..2**32-2, got {}",
                self.capacity_nodes
            ));
        }
        if self.index_threads > MAX_INDEX_THREADS {
            return bad(format!(
                "index_threads must be in 0..={MAX_INDEX_THREADS}, got {}",
                self.index_threads
            ));
        }
        for (name, w) in [
            ("prompt_weight", self.prompt_weight),
            ("output_weight", self.output_weight),
        ] {
            if !(0.0..=MAX_WEIGHT).contains(&w) {
                return bad(format!("{name} must be in [0, {MAX_WEIGHT:e}], got {w}"));
            }
        }
        if self.prompt_weight + self.output_weight <= 0.0 {
            return bad("prompt_weight and output_weight cannot both be 0".into());
        }
        if self.recycle_k > MAX_WIDTH {
            return bad(format!(
                "recycle_k must be in 0..={MAX_WIDTH}, got {}",
                self.recycle_k
            ));
        }
        if self.recycle_slots > MAX_RECYCLE_SLOTS {
            return bad(format!(
                "recycle_slots must be in 0..={MAX_RECYCLE_SLOTS}, got {}",
                self.recycle_slots
            ));
        }
        if !(self.recycle_weight > 0.0 && self.recycle_weight <= MAX_WEIGHT) {
            return bad(format!(
                "recycle_weight must be in (0, {MAX_WEIGHT:e}] (recycle_k = 0 turns recycling \
                 off), got {}",
                self.recycle_weight
            ));
        }
        if let Some((lo, hi)) = self.history_skip {
            if !(1 <= lo && lo <= hi && hi <= MAX_DEPTH) {
                return bad(format!(
                    "history_skip must be (lo, hi) with 1 <= lo <= hi <= {MAX_DEPTH}, or None; \
                     got ({lo}, {hi})"
                ));
            }
        }
        Ok(())
    }
}

/// A request id: the Python side passes an int or a str.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum RequestId {
    Int(i64),
    Str(String),
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestId::Int(i) => write!(f, "{i}"),
            RequestId::Str(s) => write!(f, "{s:?}"),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock means a panic was caught mid-operation; the structure is still
    // memory-safe and check_invariants reports any damage, so keep serving.
    m.lock().unwrap_or_else(|e| e.into_inner())
}
fn read<T>(m: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|e| e.into_inner())
}
fn write<T>(m: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|e| e.into_inner())
}

/// A request's own trie: every n-gram of its prompt, then those ending at each of its
/// verified output tokens. Its nodes return to the budget when it is dropped.
pub struct PromptTrie {
    pub trie: RwLock<Trie>,
    budget: Arc<Budget>,
    pub truncated: bool,
    /// Nodes its outputs added (bounded across requests: `Budget::own_outputs_fit`).
    outputs: AtomicU64,
}

impl Drop for PromptTrie {
    fn drop(&mut self) {
        let t = self.trie.get_mut().unwrap_or_else(|e| e.into_inner());
        self.budget.release(t.nodes() + t.allowance);
        let outputs = *self.outputs.get_mut();
        self.budget.note_own_outputs(-(outputs as i64));
    }
}

/// Where a prompt trie appears once built; only its own request waits on it.
struct PromptSlot {
    state: Mutex<SlotState>,
    ready: Condvar,
    cancel: AtomicBool,
}

enum SlotState {
    Pending,
    Ready(Arc<PromptTrie>),
    Failed(String),
    /// The request finished: the trie was dropped (or never stored).
    Closed,
}

impl PromptSlot {
    fn new() -> Self {
        PromptSlot {
            state: Mutex::new(SlotState::Pending),
            ready: Condvar::new(),
            cancel: AtomicBool::new(false),
        }
    }

    /// Stores the built trie, unless the request finished meanwhile (then it is dropped here).
    fn set(&self, v: std::result::Result<PromptTrie, String>) {
        let mut st = lock(&self.state);
        if matches!(*st, SlotState::Pending) {
            *st = match v {
                Ok(p) => SlotState::Ready(Arc::new(p)),
                Err(m) => SlotState::Failed(m),
            };
        }
        drop(st);
        self.ready.notify_all();
    }

    fn wait(&self) -> Result<Arc<PromptTrie>> {
        let mut st = lock(&self.state);
        while matches!(*st, SlotState::Pending) {
            st = self.ready.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        match &*st {
            SlotState::Ready(p) => Ok(Arc::clone(p)),
            SlotState::Failed(m) => {
                Err(Error::Internal(format!("indexing the prompt failed: {m}")))
            }
            SlotState::Closed => Err(Error::UnknownRequest(
                "the request finished while drafting".into(),
            )),
            SlotState::Pending => unreachable!("waited until not pending"),
        }
    }

    /// The trie if already built (never waits).
    fn peek(&self) -> Option<Arc<PromptTrie>> {
        match &*lock(&self.state) {
            SlotState::Ready(p) => Some(Arc::clone(p)),
            _ => None,
        }
    }

    /// `Ok(trie)` if built, `Err(true)` while still building, `Err(false)` if there will be
    /// none (failed or closed); one lock, so the answer cannot change between two looks.
    fn poll(&self) -> std::result::Result<Arc<PromptTrie>, bool> {
        match &*lock(&self.state) {
            SlotState::Ready(p) => Ok(Arc::clone(p)),
            SlotState::Pending => Err(true),
            _ => Err(false),
        }
    }

    fn is_pending(&self) -> bool {
        matches!(*lock(&self.state), SlotState::Pending)
    }

    /// Drops the trie (a draft in progress keeps its own reference until it returns).
    fn close(&self) {
        self.cancel.store(true, Ordering::Relaxed);
        let old = std::mem::replace(&mut *lock(&self.state), SlotState::Closed);
        drop(old);
        self.ready.notify_all();
    }
}

pub struct Namespace {
    pub name: String,
    /// Unique over the cache's life: the recycled predictions' key for this namespace.
    pub id: u64,
    pub history: RwLock<Trie>,
    /// Live requests and running operations using it: only an unused namespace is dropped.
    users: AtomicUsize,
    /// `Shared::tick` of its last use, and of its last entry into the eviction ring (used
    /// since it entered: it gets a second chance before its history is evicted).
    used_at: AtomicU64,
    queued_at: AtomicU64,
    /// Set once it left the name map (its history released); ring entries of it are stale.
    dropped: AtomicBool,
}

impl Namespace {
    /// Bytes it holds: its history and its own bookkeeping.
    fn bytes(&self, history: &Trie) -> u64 {
        (history.bytes() + std::mem::size_of::<Namespace>() + self.name.capacity()) as u64
    }
}

/// One use of a namespace (a live request holds one): while any exists, the namespace
/// stays in the name map, so its history is never dropped under a writer.
pub(crate) struct NsUse(Arc<Namespace>);

impl std::ops::Deref for NsUse {
    type Target = Namespace;
    fn deref(&self) -> &Namespace {
        &self.0
    }
}

impl NsUse {
    /// Another use of the same namespace (safe without the map lock: this one keeps the
    /// count above 0 meanwhile).
    fn share(&self) -> NsUse {
        self.0.users.fetch_add(1, Ordering::AcqRel);
        NsUse(Arc::clone(&self.0))
    }
}

impl Drop for NsUse {
    fn drop(&mut self) {
        self.0.users.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Where the n-grams ending at a request's last counted token sit in one trie, so counting
/// the next token's n-grams needs no walk from the root.
#[derive(Clone)]
struct Cursors {
    /// `nodes[k]`: node of the n-gram of length k+1 ending at the last counted token.
    nodes: Vec<u32>,
    /// Trie epoch the nodes were taken at (`u64::MAX`: rebuild before use).
    epoch: u64,
    /// The next token's nodes while they are found (kept to reuse its allocation).
    next: Vec<u32>,
}

/// Cursor nodes taken at trie epoch `taken`, if that is still the trie's epoch `now`.
fn current(nodes: &[u32], taken: u64, now: u64) -> &[u32] {
    if taken == now {
        nodes
    } else {
        &[]
    }
}

impl Cursors {
    fn stale() -> Self {
        Cursors {
            nodes: Vec::new(),
            epoch: u64::MAX,
            next: Vec::new(),
        }
    }
}

struct ReqState {
    /// The last `max_depth - 1` (or more) tokens of prompt + outputs.
    tail: Vec<u32>,
    /// Into the namespace's history.
    history: Cursors,
    /// Into the request's own trie.
    own: Cursors,
    /// Verified tokens that arrived while the own trie was still being built (counted into
    /// it when it is ready), and the `max_depth - 1` context tokens before the first of them.
    unindexed: Vec<u32>,
    unindexed_before: Vec<u32>,
}

struct Request {
    ns: NsUse,
    prompt_tokens: Arc<Vec<u32>>,
    prompt: Arc<PromptSlot>,
    state: Mutex<ReqState>,
}

/// Budget nodes held by an operation in progress: given back if it unwinds before handing
/// them to a trie (`std::mem::forget` once it has).
struct Held<'a>(&'a Budget, u64);
impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.release(self.1);
    }
}

/// State shared with background jobs.
struct Shared {
    cfg: Config,
    budget: Arc<Budget>,
    namespaces: RwLock<FxHashMap<String, Arc<Namespace>>>,
    /// Every namespace in eviction order (CLOCK over namespaces: the front is the next
    /// candidate); entries of dropped namespaces are discarded when they reach the front.
    ring: Mutex<VecDeque<Arc<Namespace>>>,
    /// Logical clock of namespace use.
    tick: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    evicted: AtomicU64,
    truncated_prompts: AtomicU64,
    in_flight: AtomicUsize,
    op_seq: AtomicU64,
    /// Ids of namespaces created so far.
    ns_seq: AtomicU64,
    /// The target's recycled predictions, all namespaces' (keyed by namespace id). Its lock
    /// is taken last (a draft reads it under its trie read locks) and writers hold it alone.
    recycled: RwLock<Recycled>,
}

/// Marks an operation as running (for the exact checks of `check_invariants`).
struct Busy<'a>(&'a Shared);
impl<'a> Busy<'a> {
    fn new(s: &'a Shared) -> Self {
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

/// The n-gram cache of the whole serving process.
pub struct Cache {
    shared: Arc<Shared>,
    requests: RwLock<FxHashMap<RequestId, Arc<Request>>>,
    pool: Option<Pool>,
}

/// Counters and sizes reported by `Cache::stats`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    /// Nodes stored or reserved by operations in progress: always <= `capacity_nodes`, and
    /// `history_nodes + prompt_nodes` when the cache is idle.
    pub nodes: u64,
    pub history_nodes: u64,
    /// Nodes of the live requests' own tries (their prompts, then their outputs).
    pub prompt_nodes: u64,
    pub capacity_nodes: u64,
    pub bytes: u64,
    pub live_requests: u64,
    pub pending_prompts: u64,
    pub namespaces: u64,
    pub hits: u64,
    pub misses: u64,
    pub evicted_nodes: u64,
    pub truncated_prompts: u64,
    /// Keys in the recycled-prediction table (at most `recycle_slots`).
    pub recycled_keys: u64,
}

impl Shared {
    fn now(&self) -> u64 {
        self.tick.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Marks `ns` as used now (it moves to the back of the eviction order).
    fn touch(&self, ns: &Namespace) {
        ns.used_at.store(self.now(), Ordering::Relaxed);
    }

    /// A use of namespace `name`, created if new. O(1) in the number of namespaces.
    fn use_namespace(&self, name: &str) -> NsUse {
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
        let mut all = write(&self.namespaces);
        if let Some(ns) = all.get(name) {
            return take(ns);
        }
        let ns = Arc::new(Namespace {
            name: name.to_owned(),
            id: self.ns_seq.fetch_add(1, Ordering::Relaxed),
            history: RwLock::new(Trie::new()),
            users: AtomicUsize::new(0),
            used_at: AtomicU64::new(now),
            queued_at: AtomicU64::new(now),
            dropped: AtomicBool::new(false),
        });
        all.insert(name.to_owned(), Arc::clone(&ns));
        let got = take(&ns);
        drop(all);
        lock(&self.ring).push_back(ns);
        self.tidy();
        got
    }

    /// Looks at the first `TIDY_LOOKS` ring entries: stale ones and unused empty
    /// namespaces leave it, the others go to the back.
    fn tidy(&self) {
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

    fn requeue(&self, ns: Arc<Namespace>) {
        ns.queued_at.store(self.now(), Ordering::Relaxed);
        lock(&self.ring).push_back(ns);
    }

    /// Drops `ns` (leaving the name map, its history's nodes back to the budget) if it is
    /// unused and holds at most `max_nodes` nodes. Returns 1 + the nodes released if it
    /// was dropped, 0 if not.
    fn try_drop(&self, ns: &Arc<Namespace>, max_nodes: u64) -> u64 {
        let mut all = write(&self.namespaces);
        let mine = all.get(&ns.name).is_some_and(|n| Arc::ptr_eq(n, ns));
        if !mine || ns.users.load(Ordering::Acquire) != 0 {
            return 0;
        }
        // Never wait for the history under the map lock (every lookup waits on that one): a
        // namespace being saved or compacted right now is simply not dropped this time.
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
    fn make_room(&self, want: u64, requester: Option<&Namespace>) -> u64 {
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
    /// shrunk history gives its memory back. Returns the nodes freed.
    fn evict_in(&self, ns: &Namespace, want: u64) -> u64 {
        let mut freed = 0;
        for _ in 0..MAX_PASSES {
            let slots = read(&ns.history).arena.slots();
            let mut visited = 0u32;
            while visited < slots && freed < want {
                let mut h = write(&ns.history);
                let f = h.sweep(SWEEP_VISITS.min(slots - visited), want - freed);
                drop(h);
                self.budget.release(f);
                freed += f;
                visited = visited.saturating_add(SWEEP_VISITS);
            }
            if freed >= want || read(&ns.history).nodes() == 0 {
                break;
            }
        }
        let mut h = write(&ns.history);
        if h.free_slots() > h.nodes() + COMPACT_SLACK {
            h.compact();
        }
        freed
    }

    /// Reserves up to `need` nodes for a write of `requester`'s, evicting shared history if
    /// the budget is short.
    fn reserve(&self, need: u64, requester: &Namespace) -> u64 {
        let mut got = self.budget.reserve_up_to(need);
        if got < need {
            let slack = (self.budget.capacity() / 64).max(need - got);
            self.make_room(slack, Some(requester));
            got += self.budget.reserve_up_to(need - got);
        }
        got
    }

    /// Indexes every window of `text` into `ns`'s history, `CHUNK_TOKENS` windows per lock.
    fn add_history(&self, ns: &Namespace, text: &[u32]) {
        self.add_history_part(ns, text, 0..text.len());
    }

    /// Counts into `ns`'s history the n-grams of `text` that end at a token in `part`
    /// (parts that tile the text count exactly what the whole text does).
    fn add_history_part(&self, ns: &Namespace, text: &[u32], part: std::ops::Range<usize>) {
        let depth = self.cfg.max_depth;
        let mut cur = Cursors::stale();
        let mut s = part.start;
        while s < part.end {
            let end = (s + CHUNK_TOKENS).min(part.end);
            // The n-grams ending at each token, as `extend` counts them (same counts as all
            // windows of the text, and suffix links come for free).
            let before = &text[s.saturating_sub(depth - 1)..s];
            self.count_into(ns, &ns.history, &mut cur, before, &text[s..end]);
            s = end;
        }
    }

    /// Counts into `trie` the n-grams ending at each token of `chunk` (at most
    /// `CHUNK_TOKENS`), which follows `before` in the text, under one write-lock hold and a
    /// budget reservation of what it may need. Returns the nodes it created.
    fn count_into(
        &self,
        ns: &Namespace,
        trie: &RwLock<Trie>,
        cur: &mut Cursors,
        before: &[u32],
        chunk: &[u32],
    ) -> u64 {
        let depth = self.cfg.max_depth;
        let got = self.reserve((chunk.len() * depth + depth * depth) as u64, ns);
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
        got - unused
    }

    /// `count_into` the request's own trie, while own-trie outputs fit their share of the
    /// capacity; past it, this request's outputs reach only the shared history (and the
    /// cursors are rebuilt from `before` once there is room again).
    fn count_own(
        &self,
        ns: &Namespace,
        own: &PromptTrie,
        cur: &mut Cursors,
        before: &[u32],
        chunk: &[u32],
    ) {
        if self.cfg.prompt_weight == 0.0 {
            return; // drafts never read the request's own trie
        }
        if !self.budget.own_outputs_fit() {
            cur.epoch = u64::MAX;
            return;
        }
        let added = self.count_into(ns, &own.trie, cur, before, chunk);
        own.outputs.fetch_add(added, Ordering::Relaxed);
        self.budget.note_own_outputs(added as i64);
    }

    /// Counts the tokens that arrived while `own` was being built into it (if any).
    fn catch_up(&self, ns: &Namespace, own: &PromptTrie, st: &mut ReqState) {
        if st.unindexed.is_empty() {
            return;
        }
        let text = std::mem::take(&mut st.unindexed);
        let mut before = std::mem::take(&mut st.unindexed_before);
        let keep = self.cfg.max_depth - 1;
        for chunk in text.chunks(CHUNK_TOKENS) {
            self.count_own(ns, own, &mut st.own, &before, chunk);
            before.extend_from_slice(chunk);
            before.drain(..before.len().saturating_sub(keep));
        }
    }

    /// Builds the prompt trie of `text`; stops early (truncated) when the budget is spent
    /// even after evicting shared history, or when the request was finished meanwhile.
    fn build_prompt(&self, ns: &Namespace, text: &[u32], slot: &PromptSlot) -> PromptTrie {
        let depth = self.cfg.max_depth;
        let mut p = PromptTrie {
            trie: RwLock::new(Trie::new()),
            budget: Arc::clone(&self.budget),
            truncated: false,
            outputs: AtomicU64::new(0),
        };
        if self.cfg.prompt_weight == 0.0 {
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

    fn run_build(&self, ns: &Namespace, text: &[u32], slot: &PromptSlot) {
        if slot.cancel.load(Ordering::Relaxed) {
            // Finished (or its cache dropped) while queued: nobody will draft from it.
            slot.set(Err("cancelled before it started".into()));
            return;
        }
        let r = catch_unwind(AssertUnwindSafe(|| self.build_prompt(ns, text, slot)));
        slot.set(r.map_err(|e| panic_message(&e)));
    }
}

impl Drop for Cache {
    /// Queued prompt builds of the live requests are cancelled (the pool's threads would
    /// otherwise index prompts nobody can draft from any more).
    fn drop(&mut self) {
        for req in read(&self.requests).values() {
            req.prompt.cancel.store(true, Ordering::Relaxed);
        }
    }
}

pub fn panic_message(e: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = e.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = e.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic".to_owned()
    }
}

impl Cache {
    pub fn new(cfg: Config) -> Result<Self> {
        cfg.validate()?;
        let threads = if cfg.index_threads > 0 {
            cfg.index_threads
        } else {
            std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .min(4)
        };
        let pool = if cfg.background_indexing {
            let started = Pool::new(threads);
            Some(started.map_err(|e| Error::Io(format!("cannot start {threads} threads: {e}")))?)
        } else {
            None
        };
        let recycled = RwLock::new(Recycled::new(cfg.recycle_k, cfg.recycle_slots));
        let shared = Arc::new(Shared {
            budget: Arc::new(Budget::new(cfg.capacity_nodes)),
            cfg,
            namespaces: RwLock::new(FxHashMap::default()),
            ring: Mutex::new(VecDeque::new()),
            tick: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            truncated_prompts: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            op_seq: AtomicU64::new(0),
            ns_seq: AtomicU64::new(0),
            recycled,
        });
        drop(shared.use_namespace("default"));
        Ok(Cache {
            shared,
            requests: RwLock::new(FxHashMap::default()),
            pool,
        })
    }

    pub fn config(&self) -> &Config {
        &self.shared.cfg
    }

    fn request(&self, rid: &RequestId) -> Result<Arc<Request>> {
        read(&self.requests).get(rid).cloned().ok_or_else(|| {
            Error::UnknownRequest(format!(
                "request {rid} is not live (never started or already finished)"
            ))
        })
    }

    /// Registers a request and indexes its prompt (in the background when configured).
    pub fn start_request(&self, rid: RequestId, prompt: Vec<u32>, namespace: &str) -> Result<()> {
        let _busy = Busy::new(&self.shared);
        if prompt.is_empty() {
            return Err(Error::InvalidInput(
                "prompt must hold at least one token".into(),
            ));
        }
        check_namespace(namespace)?;
        let keep = self.shared.cfg.max_depth - 1;
        let ns = self.shared.use_namespace(namespace);
        let req = Arc::new(Request {
            ns,
            state: Mutex::new(ReqState {
                tail: prompt[prompt.len().saturating_sub(keep)..].to_vec(),
                history: Cursors::stale(),
                own: Cursors::stale(),
                unindexed: Vec::new(),
                unindexed_before: Vec::new(),
            }),
            prompt_tokens: Arc::new(prompt),
            prompt: Arc::new(PromptSlot::new()),
        });
        {
            let mut reqs = write(&self.requests);
            if reqs.contains_key(&rid) {
                return Err(Error::RequestExists(format!(
                    "request {rid} is already live"
                )));
            }
            reqs.insert(rid, Arc::clone(&req));
        }
        let shared = Arc::clone(&self.shared);
        let text = Arc::clone(&req.prompt_tokens);
        let slot = Arc::clone(&req.prompt);
        let ns = req.ns.share();
        shared.in_flight.fetch_add(1, Ordering::AcqRel);
        let job: Box<dyn FnOnce() + Send> = Box::new(move || {
            shared.run_build(&ns, &text, &slot);
            drop(ns);
            // Drop our handle first: a trie of a finished request is freed before we report done.
            drop(slot);
            shared.op_seq.fetch_add(1, Ordering::AcqRel);
            shared.in_flight.fetch_sub(1, Ordering::AcqRel);
        });
        let inline = match &self.pool {
            Some(pool) => pool.submit(job),
            None => Some(job),
        };
        if let Some(job) = inline {
            job();
        }
        Ok(())
    }

    /// Appends verified tokens to the request's context and counts every n-gram (up to
    /// `max_depth`) that ends at one of them, in the namespace's history and in the request's
    /// own trie (later, if that is still being built).
    pub fn extend(&self, rid: &RequestId, tokens: &[u32]) -> Result<()> {
        let req = self.request(rid)?;
        self.extend_req(&req, tokens)
    }

    /// `extend`, also keeping the target's predictions that chose each new token: row `j` of
    /// `ids` / `probs` (`k` entries each, `tokens.len()` rows) is the target's top-`k` after
    /// the context token before `tokens[j]`, kept under that token and under it with the one
    /// before (see `recycle.rs`). Where `recycle_k` is 0 the rows are checked, not kept.
    pub fn extend_predicted(
        &self,
        rid: &RequestId,
        tokens: &[u32],
        ids: &[u32],
        probs: &[f32],
        k: usize,
    ) -> Result<()> {
        let rows = tokens.len();
        check_predictions(rows, ids, probs, k)?;
        let req = self.request(rid)?;
        let before = {
            let st = lock(&req.state);
            let n = st.tail.len();
            [
                n.checked_sub(2).map(|i| st.tail[i]),
                st.tail.last().copied(),
            ]
        };
        self.extend_req(&req, tokens)?;
        // The token each row followed, and the one before it.
        let keys = (0..rows).map(|j| match j {
            0 => (before[0], before[1]),
            1 => (before[1], Some(tokens[0])),
            _ => (Some(tokens[j - 2]), Some(tokens[j - 1])),
        });
        self.recycle(&req, keys, ids, probs, k);
        Ok(())
    }

    /// Keeps the target's top-`k` predictions after each of `toks` (row `j` of `ids` /
    /// `probs`), kept under `toks[j]` and under `after[j], toks[j]` for request `rid`'s
    /// namespace, without extending its context: for distributions computed outside the
    /// accepted path (a prompt's prefill, the rejected nodes of a draft tree). `after`:
    /// the token before each of `toks` (`None`: `toks` is a sequence, `toks[j - 1]`, and the
    /// first row has only the token's key). Checked as in `extend_predicted`.
    pub fn recycle_after(
        &self,
        rid: &RequestId,
        toks: &[u32],
        after: Option<&[u32]>,
        ids: &[u32],
        probs: &[f32],
        k: usize,
    ) -> Result<()> {
        check_predictions(toks.len(), ids, probs, k)?;
        if let Some(a) = after.filter(|a| a.len() != toks.len()) {
            return Err(Error::InvalidInput(format!(
                "{} tokens but {} tokens before them",
                toks.len(),
                a.len()
            )));
        }
        let req = self.request(rid)?;
        let keys = (0..toks.len()).map(|j| {
            let prev = match after {
                Some(a) => Some(a[j]),
                None => j.checked_sub(1).map(|i| toks[i]),
            };
            (prev, Some(toks[j]))
        });
        self.recycle(&req, keys, ids, probs, k);
        Ok(())
    }

    fn recycle(
        &self,
        req: &Request,
        keys: impl Iterator<Item = (Option<u32>, Option<u32>)>,
        ids: &[u32],
        probs: &[f32],
        k: usize,
    ) {
        if !self.shared.cfg.recycles() {
            return; // the table keeps nothing: its lock is not taken
        }
        let mut table = write(&self.shared.recycled);
        let ns = req.ns.id;
        let mut row = Vec::with_capacity(k);
        for (j, (prev, tok)) in keys.enumerate() {
            let Some(tok) = tok else { continue };
            row.clear();
            let span = j * k..(j + 1) * k;
            row.extend(
                ids[span.clone()]
                    .iter()
                    .copied()
                    .zip(probs[span].iter().copied()),
            );
            table.put((ns, ALONE, tok), &row);
            if let Some(prev) = prev {
                table.put((ns, prev, tok), &row);
            }
        }
    }

    /// `extend` for many requests: `tokens` is their new tokens one after another,
    /// `lengths[i]` how many are request i's. Every id is looked up first, so an unknown one
    /// fails the call before anything changes.
    pub fn extend_batch(
        &self,
        rids: &[RequestId],
        tokens: &[u32],
        lengths: &[usize],
    ) -> Result<()> {
        if rids.len() != lengths.len() {
            return Err(Error::InvalidInput(format!(
                "{} request ids but {} lengths",
                rids.len(),
                lengths.len()
            )));
        }
        let total = lengths.iter().try_fold(0usize, |a, &n| a.checked_add(n));
        if total != Some(tokens.len()) {
            return Err(Error::InvalidInput(format!(
                "lengths add up to {}, not to the {} tokens given",
                total.map_or_else(|| "more than 2**64".into(), |t| t.to_string()),
                tokens.len()
            )));
        }
        let reqs = rids
            .iter()
            .map(|rid| self.request(rid))
            .collect::<Result<Vec<_>>>()?;
        let mut at = 0;
        for (req, &n) in reqs.iter().zip(lengths) {
            self.extend_req(req, &tokens[at..at + n])?;
            at += n;
        }
        Ok(())
    }

    /// `extend` then `draft` with one lookup of the request; nothing is extended when
    /// `budget` is bad.
    pub fn step(
        &self,
        rid: &RequestId,
        tokens: &[u32],
        budget: usize,
        multi_branch: bool,
    ) -> Result<DraftTree> {
        check_budget(budget)?;
        let req = self.request(rid)?;
        self.extend_req(&req, tokens)?;
        self.draft_req(&req, budget, multi_branch)
    }

    fn extend_req(&self, req: &Request, tokens: &[u32]) -> Result<()> {
        let _busy = Busy::new(&self.shared);
        let keep = self.shared.cfg.max_depth - 1;
        let mut guard = lock(&req.state);
        let st = &mut *guard;
        let own = req.prompt.poll();
        if let Ok(p) = &own {
            self.shared.catch_up(&req.ns, p, st);
        }
        if !tokens.is_empty() {
            self.shared.touch(&req.ns);
        }
        for chunk in tokens.chunks(CHUNK_TOKENS) {
            let sh = &self.shared;
            if sh.cfg.output_weight > 0.0 {
                // At weight 0 drafts never read the shared history: nothing to count there.
                sh.count_into(&req.ns, &req.ns.history, &mut st.history, &st.tail, chunk);
            }
            match &own {
                Ok(p) => sh.count_own(&req.ns, p, &mut st.own, &st.tail, chunk),
                Err(true) => {
                    if st.unindexed.is_empty() {
                        st.unindexed_before =
                            st.tail[st.tail.len().saturating_sub(keep)..].to_vec();
                    }
                    st.unindexed.extend_from_slice(chunk);
                }
                // No trie will come (its build failed, or the request finished meanwhile).
                Err(false) => st.unindexed.clear(),
            }
            st.tail.extend_from_slice(chunk);
            if st.tail.len() > 4 * keep.max(1) {
                st.tail.drain(..st.tail.len() - keep);
            }
        }
        Ok(())
    }

    /// Drafts for one request (waits for its own prompt index if still building).
    pub fn draft(&self, rid: &RequestId, budget: usize, multi_branch: bool) -> Result<DraftTree> {
        check_budget(budget)?;
        let req = self.request(rid)?;
        self.draft_req(&req, budget, multi_branch)
    }

    fn draft_req(&self, req: &Request, budget: usize, multi_branch: bool) -> Result<DraftTree> {
        // Busy: a draft may hold the prompt trie of a request finished meanwhile.
        let _busy = Busy::new(&self.shared);
        thread_local! {
            // The request's context tail and cursors, copied out so its lock is not held
            // while drafting (into buffers that keep their allocations).
            static COPY: std::cell::Cell<[Vec<u32>; 3]> = Default::default();
        }
        let (own, st) = self.own_trie(req)?;
        let [mut tail, mut own_nodes, mut hist_nodes] = COPY.take();
        tail.clone_from(&st.tail);
        own_nodes.clone_from(&st.own.nodes);
        hist_nodes.clone_from(&st.history.nodes);
        let epochs = [st.own.epoch, st.history.epoch];
        drop(st);
        let p = read(&own.trie);
        let h = read(&req.ns.history);
        let cfg = &self.shared.cfg;
        // Off: not even the table's lock on this path.
        let recycled = cfg.recycles().then(|| read(&self.shared.recycled));
        let src = Sources {
            prompt: Some(&p),
            history: Some(&h),
            prompt_weight: cfg.prompt_weight,
            output_weight: cfg.output_weight,
            max_depth: cfg.max_depth,
            history_skip: cfg.history_skip,
            suffixes: [
                current(&own_nodes, epochs[0], p.epoch),
                current(&hist_nodes, epochs[1], h.epoch),
            ],
            recycled: recycled
                .as_deref()
                .filter(|t| !t.is_empty())
                .map(|table| RecycleView {
                    table,
                    namespace: req.ns.id,
                    weight: cfg.recycle_weight,
                }),
        };
        let tree = src.draft(&tail, budget, multi_branch);
        drop(recycled);
        drop(h);
        drop(p);
        COPY.set([tail, own_nodes, hist_nodes]);
        let counter = if tree.num_nodes() > 1 {
            &self.shared.hits
        } else {
            &self.shared.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(tree)
    }

    /// Drafts for many requests, in parallel on `threads` threads when there are enough.
    pub fn draft_batch(
        &self,
        rids: &[RequestId],
        budget: usize,
        multi_branch: bool,
        threads: usize,
    ) -> Result<Vec<DraftTree>> {
        check_budget(budget)?;
        let reqs = rids
            .iter()
            .map(|r| self.request(r))
            .collect::<Result<Vec<_>>>()?;
        // A scoped thread costs tens of µs to start: only worth it for 16+ drafts per thread.
        let threads = threads.max(1).min(reqs.len() / 16).max(1);
        if threads == 1 {
            return reqs
                .iter()
                .map(|r| self.draft_req(r, budget, multi_branch))
                .collect();
        }
        let per = reqs.len().div_ceil(threads);
        let parts: Vec<Result<Vec<DraftTree>>> = std::thread::scope(|s| {
            let hs: Vec<_> = reqs
                .chunks(per)
                .map(|part| {
                    s.spawn(move || {
                        catch_unwind(AssertUnwindSafe(|| {
                            part.iter()
                                .map(|r| self.draft_req(r, budget, multi_branch))
                                .collect::<Result<Vec<_>>>()
                        }))
                        .unwrap_or_else(|e| Err(Error::Internal(panic_message(&e))))
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|e| Err(Error::Internal(panic_message(&e))))
                })
                .collect()
        });
        let mut out = Vec::with_capacity(reqs.len());
        for p in parts {
            out.extend(p?);
        }
        Ok(out)
    }

    /// Ends a request: drops its prompt trie, or merges the prompt into the namespace's
    /// history first when `keep_prompt` (default: the configured `keep_prompt_as_history`).
    pub fn finish_request(&self, rid: &RequestId, keep_prompt: Option<bool>) -> Result<()> {
        let _busy = Busy::new(&self.shared);
        let req = write(&self.requests).remove(rid).ok_or_else(|| {
            Error::UnknownRequest(format!(
                "request {rid} is not live (never started or already finished)"
            ))
        })?;
        req.prompt.close();
        let read = self.shared.cfg.output_weight > 0.0;
        if read && keep_prompt.unwrap_or(self.shared.cfg.keep_prompt_as_history) {
            self.shared.add_history(&req.ns, &req.prompt_tokens);
        }
        // A namespace left empty and unused by its last request goes now (if a draft still
        // holds the request, `tidy` or `make_room` drops it later).
        let ns = Arc::clone(&req.ns.0);
        drop(req);
        if read_nodes(&ns) == 0 {
            self.shared.try_drop(&ns, 0);
        }
        Ok(())
    }

    /// Counts every window of every text into `namespace`'s history.
    pub fn add_history(&self, corpus: &[Vec<u32>], namespace: &str) -> Result<()> {
        let _busy = Busy::new(&self.shared);
        check_namespace(namespace)?;
        let ns = self.shared.use_namespace(namespace);
        for text in corpus {
            self.shared.add_history(&ns, text);
        }
        Ok(())
    }

    /// `add_history` of one text, counting only the n-grams that end at a token in `part`
    /// (the binding calls it part by part, checking for Ctrl-C in between).
    pub fn add_history_part(
        &self,
        text: &[u32],
        part: std::ops::Range<usize>,
        namespace: &str,
    ) -> Result<()> {
        let _busy = Busy::new(&self.shared);
        check_namespace(namespace)?;
        if part.start > part.end || part.end > text.len() {
            return Err(Error::InvalidInput(format!(
                "part {part:?} of a text of {} tokens",
                text.len()
            )));
        }
        let ns = self.shared.use_namespace(namespace);
        self.shared.add_history_part(&ns, text, part);
        Ok(())
    }

    pub fn stats(&self) -> Stats {
        let mut s = Stats {
            capacity_nodes: self.shared.budget.capacity(),
            hits: self.shared.hits.load(Ordering::Relaxed),
            misses: self.shared.misses.load(Ordering::Relaxed),
            evicted_nodes: self.shared.evicted.load(Ordering::Relaxed),
            truncated_prompts: self.shared.truncated_prompts.load(Ordering::Relaxed),
            ..Stats::default()
        };
        for ns in read(&self.shared.namespaces).values() {
            let h = read(&ns.history);
            s.history_nodes += h.nodes();
            s.bytes += ns.bytes(&h);
            s.namespaces += 1;
        }
        for req in read(&self.requests).values() {
            s.live_requests += 1;
            if let Some(p) = req.prompt.peek() {
                let t = read(&p.trie);
                s.prompt_nodes += t.nodes();
                s.bytes += t.bytes() as u64;
            } else if req.prompt.is_pending() {
                s.pending_prompts += 1;
            }
        }
        {
            let r = read(&self.shared.recycled);
            s.recycled_keys = r.len() as u64;
            s.bytes += r.bytes() as u64;
        }
        // The per-trie sums are read one trie at a time, so under concurrent operations they
        // are no snapshot; the budget is (stored plus reserved nodes, never above capacity).
        s.nodes = self.shared.budget.used();
        s
    }

    /// Checks every trie's structure and the capacity bound; when no other operation ran
    /// during the check, also that the budget accounts exactly for the stored nodes.
    pub fn check_invariants(&self) -> Result<()> {
        read(&self.shared.recycled)
            .check()
            .map_err(|m| Error::Internal(format!("recycled predictions: {m}")))?;
        let seq0 = self.shared.op_seq.load(Ordering::Acquire);
        let idle0 = self.shared.in_flight.load(Ordering::Acquire) == 0;
        let mut nodes = 0;
        for ns in read(&self.shared.namespaces).values() {
            let h = read(&ns.history);
            h.check()
                .map_err(|e| Error::Invariant(format!("namespace {:?}: {e}", ns.name)))?;
            if h.allowance != 0 {
                return Err(Error::Invariant(format!(
                    "namespace {:?} holds an unused reservation",
                    ns.name
                )));
            }
            nodes += h.nodes();
        }
        for (rid, req) in read(&self.requests).iter() {
            if let Some(p) = req.prompt.peek() {
                let t = read(&p.trie);
                t.check()
                    .map_err(|e| Error::Invariant(format!("prompt of request {rid}: {e}")))?;
                if t.allowance != 0 {
                    return Err(Error::Invariant(format!(
                        "request {rid}'s trie holds an unused reservation"
                    )));
                }
                nodes += t.nodes();
            }
            let st = lock(&req.state);
            if st.tail.is_empty() {
                return Err(Error::Invariant(format!(
                    "request {rid} has an empty context"
                )));
            }
        }
        let used = self.shared.budget.used();
        let cap = self.shared.budget.capacity();
        if used > cap {
            return Err(Error::Invariant(format!(
                "{used} nodes reserved, capacity {cap}"
            )));
        }
        let idle1 = self.shared.in_flight.load(Ordering::Acquire) == 0;
        if idle0 && idle1 && seq0 == self.shared.op_seq.load(Ordering::Acquire) && nodes != used {
            return Err(Error::Invariant(format!(
                "{nodes} nodes stored but {used} accounted"
            )));
        }
        Ok(())
    }

    /// Every stored n-gram of `namespace`'s history with its count (tests and debugging).
    pub fn history_ngrams(&self, namespace: &str) -> Vec<(Vec<u32>, u32)> {
        let all = read(&self.shared.namespaces);
        match all.get(namespace) {
            Some(ns) => read(&ns.history).ngrams(),
            None => Vec::new(),
        }
    }

    /// Every n-gram of `rid`'s own trie (its prompt, then its outputs so far) with its
    /// count (waits for indexing).
    pub fn prompt_ngrams(&self, rid: &RequestId) -> Result<Vec<(Vec<u32>, u32)>> {
        let _busy = Busy::new(&self.shared);
        let req = self.request(rid)?;
        let (own, st) = self.own_trie(&req)?;
        drop(st);
        let t = read(&own.trie);
        Ok(t.ngrams())
    }

    /// `req`'s own trie once built (waits for it) with every output counted into it, and
    /// the request's state, still locked.
    fn own_trie<'r>(
        &self,
        req: &'r Request,
    ) -> Result<(Arc<PromptTrie>, MutexGuard<'r, ReqState>)> {
        let own = req.prompt.wait()?;
        let mut st = lock(&req.state);
        self.shared.catch_up(&req.ns, &own, &mut st);
        Ok((own, st))
    }

    /// The last `max_depth - 1` (or more) tokens of `rid`'s context.
    pub fn context_tail(&self, rid: &RequestId) -> Result<Vec<u32>> {
        Ok(lock(&self.request(rid)?.state).tail.clone())
    }

    /// Namespaces and their history tries by name, for persistence.
    pub(crate) fn namespaces(&self) -> Vec<Arc<Namespace>> {
        let mut all: Vec<_> = read(&self.shared.namespaces).values().cloned().collect();
        all.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// Installs a loaded history trie for `name` (its nodes must be reserved already).
    /// Replaces `name`'s history by `trie` (whose nodes the caller reserved); the replaced
    /// trie's nodes go back to the budget.
    pub(crate) fn install_history(&self, name: &str, trie: Trie) {
        let ns = self.shared.use_namespace(name);
        let old = std::mem::replace(&mut *write(&ns.history), trie);
        self.shared.budget.release(old.nodes() + old.allowance);
    }

    pub(crate) fn budget(&self) -> &Budget {
        &self.shared.budget
    }
}

fn read_nodes(ns: &Namespace) -> u64 {
    read(&ns.history).nodes()
}

fn check_namespace(name: &str) -> Result<()> {
    if name.len() > MAX_NAMESPACE_BYTES {
        return Err(Error::InvalidInput(format!(
            "namespace names are at most {MAX_NAMESPACE_BYTES} bytes, got {}",
            name.len()
        )));
    }
    Ok(())
}

/// `rows` rows of `k >= 1` predictions, probabilities in [0, 1].
fn check_predictions(rows: usize, ids: &[u32], probs: &[f32], k: usize) -> Result<()> {
    if k == 0 || ids.len() != rows * k || probs.len() != rows * k {
        return Err(Error::InvalidInput(format!(
            "predictions must be {rows} rows (one per token) of k >= 1 entries, got {} ids \
             and {} probabilities for k = {k}",
            ids.len(),
            probs.len()
        )));
    }
    if let Some(p) = probs.iter().find(|p| !(0.0..=1.0).contains(*p)) {
        return Err(Error::InvalidInput(format!(
            "prediction probabilities must lie in [0, 1], got {p}"
        )));
    }
    Ok(())
}

fn check_budget(budget: usize) -> Result<()> {
    if !(1..=MAX_BUDGET).contains(&budget) {
        return Err(Error::InvalidInput(format!(
            "budget must be in 1..={MAX_BUDGET}, got {budget}"
        )));
    }
    Ok(())
}

/// Counts in `t` every n-gram (up to `depth` tokens) ending at a token of `chunk`, which
/// follows `before` (at least the text's last `depth - 1` tokens, or all of it) through the
/// cursors `cur`. If the allowance runs out, some n-grams are not stored and `cur` is left
/// stale (rebuilt on the next call).
fn count_ngrams(t: &mut Trie, cur: &mut Cursors, before: &[u32], chunk: &[u32], depth: usize) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap as Map;

    fn cfg(depth: usize, cap: u64, bg: bool) -> Config {
        Config {
            max_depth: depth,
            capacity_nodes: cap,
            background_indexing: bg,
            ..Config::default()
        }
    }

    fn naive_outputs(prompt: &[u32], outs: &[u32], depth: usize) -> Map<Vec<u32>, u32> {
        let ctx: Vec<u32> = prompt.iter().chain(outs).copied().collect();
        let mut m = Map::new();
        for j in prompt.len()..ctx.len() {
            for s in (j + 1).saturating_sub(depth)..=j {
                *m.entry(ctx[s..=j].to_vec()).or_insert(0) += 1;
            }
        }
        m
    }

    #[test]
    fn extend_counts_equal_naive_recount() {
        let c = Cache::new(cfg(4, 1 << 20, false)).unwrap();
        let prompt = vec![1, 2, 3, 1, 2];
        let outs: Vec<u32> = vec![3, 1, 2, 4, 1, 2, 3, 3, 3];
        let rid = RequestId::Int(1);
        c.start_request(rid.clone(), prompt.clone(), "default")
            .unwrap();
        for part in outs.chunks(2) {
            c.extend(&rid, part).unwrap();
            c.check_invariants().unwrap();
        }
        let ns = c.namespaces()[0].clone();
        let h = ns.history.read().unwrap();
        let got: Map<Vec<u32>, u32> = h.ngrams().into_iter().filter(|(_, n)| *n > 0).collect();
        assert_eq!(got, naive_outputs(&prompt, &outs, 4));
    }

    #[test]
    fn outputs_before_the_prompt_is_indexed_are_counted_once_it_is() {
        let c = Cache::new(Config {
            index_threads: 1,
            ..cfg(4, 1 << 26, true)
        })
        .unwrap();
        // The one indexing thread is busy with a long prompt, so request 2's waits.
        let long: Vec<u32> = (0..400_000u32)
            .map(|i| i.wrapping_mul(2_654_435_761) % 5000)
            .collect();
        c.start_request(RequestId::Int(1), long, "default").unwrap();
        let prompt = vec![1, 2, 3, 1, 2];
        let outs: Vec<u32> = vec![3, 1, 2, 4, 1, 2, 3, 3, 3];
        let rid = RequestId::Int(2);
        c.start_request(rid.clone(), prompt.clone(), "default")
            .unwrap();
        assert!(c.stats().pending_prompts >= 1);
        c.extend(&rid, &outs[..4]).unwrap();
        c.draft(&rid, 4, true).unwrap();
        c.extend(&rid, &outs[4..]).unwrap();
        let got: Map<Vec<u32>, u32> = c
            .prompt_ngrams(&rid)
            .unwrap()
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .collect();
        let all: Vec<u32> = prompt.iter().chain(&outs).copied().collect();
        assert_eq!(got, naive_outputs(&[], &all, 4));
        c.finish_request(&RequestId::Int(1), None).unwrap();
        c.check_invariants().unwrap();
    }

    #[test]
    fn own_output_nodes_stay_under_half_the_capacity() {
        let cap = 4_000;
        let c = Cache::new(cfg(4, cap, false)).unwrap();
        let rid = RequestId::Int(1);
        c.start_request(rid.clone(), vec![1, 2, 3], "default")
            .unwrap();
        let prompt_nodes = c.stats().prompt_nodes;
        // Novel text: every token brings new n-grams to both tries.
        for i in 0..3_000u32 {
            c.extend(&rid, &[i.wrapping_mul(2_654_435_761) % 100_000])
                .unwrap();
        }
        c.check_invariants().unwrap();
        let s = c.stats();
        // The check runs before each chunk, so one chunk (here 1 token: <= 4 + 16 nodes) may
        // pass the line.
        assert!(s.prompt_nodes <= cap / 2 + prompt_nodes + 20, "{s:?}");
        assert!(s.history_nodes > 0 && s.nodes <= cap, "{s:?}");
        assert!(c.budget().own_outputs() >= cap / 2);
        c.finish_request(&rid, None).unwrap();
        assert_eq!(c.budget().own_outputs(), 0);
        assert_eq!(c.budget().used(), c.stats().history_nodes);
    }

    #[test]
    fn errors_for_unknown_and_reused_ids() {
        let c = Cache::new(cfg(4, 1000, true)).unwrap();
        let a = RequestId::Str("a".into());
        c.start_request(a.clone(), vec![1], "default").unwrap();
        assert_eq!(
            c.start_request(a.clone(), vec![1], "default")
                .unwrap_err()
                .kind(),
            "RequestExists"
        );
        c.finish_request(&a, None).unwrap();
        assert_eq!(c.extend(&a, &[1]).unwrap_err().kind(), "UnknownRequest");
        assert_eq!(c.draft(&a, 4, true).unwrap_err().kind(), "UnknownRequest");
        assert_eq!(
            c.finish_request(&a, None).unwrap_err().kind(),
            "UnknownRequest"
        );
        assert_eq!(
            c.start_request(a, vec![], "default").unwrap_err().kind(),
            "InvalidInput"
        );
        assert!(Cache::new(cfg(1, 10, true)).is_err());
    }

    #[test]
    fn a_noisy_namespace_leaves_the_others_their_share() {
        let cap = 20_000u64;
        let c = Cache::new(cfg(12, cap, false)).unwrap();
        let mut x = 7u32;
        let mut rand = |m: u32| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x % m
        };
        for q in 0..4 {
            let t: Vec<u32> = (0..150).map(|_| rand(500)).collect();
            c.add_history(&[t], &format!("quiet-{q}")).unwrap();
        }
        let quiet: Vec<_> = (0..4)
            .map(|q| c.history_ngrams(&format!("quiet-{q}")).len())
            .collect();
        for _ in 0..60 {
            let t: Vec<u32> = (0..2000).map(|_| rand(32_000)).collect();
            c.add_history(&[t], "noisy").unwrap();
            assert!(c.stats().nodes <= cap);
        }
        // Together the quiet ones hold less than half the capacity, so the noisy one, past
        // its half, evicts only its own history: the quiet ones keep every n-gram.
        assert!(quiet.iter().sum::<usize>() < (cap / NAMESPACE_SHARE) as usize);
        assert!(c.history_ngrams("noisy").len() > (cap / NAMESPACE_SHARE) as usize);
        for (q, &n) in quiet.iter().enumerate() {
            assert_eq!(c.history_ngrams(&format!("quiet-{q}")).len(), n);
        }
        c.check_invariants().unwrap();
    }

    #[test]
    fn eviction_looks_at_a_bounded_number_of_namespaces() {
        // 3,000 namespaces with a few nodes each, then one that needs room over and over:
        // every eviction frees what it needs from the ring's front, never sweeping them all.
        let c = Cache::new(cfg(4, 20_000, false)).unwrap();
        for i in 0..3000u32 {
            c.add_history(&[vec![i, i + 1, i + 2]], &format!("t{i}"))
                .unwrap();
        }
        // 6 nodes each; the empty "default" went when the first came.
        assert_eq!((c.stats().namespaces, c.stats().nodes), (3000, 18_000));
        let t: Vec<u32> = (0..20_000u32).map(|i| i * 7 % 9973).collect();
        c.add_history(&[t], "big").unwrap();
        let s = c.stats();
        assert!(s.nodes <= 20_000);
        // Tenants went whole, as many as "big" needed before it reached its share; every
        // other one is untouched (no sweep passed over it: a pass halves each count).
        let mut gone = 0;
        for i in 0..3000 {
            let g = c.history_ngrams(&format!("t{i}"));
            if g.is_empty() {
                gone += 1;
            } else {
                assert!(
                    g.len() == 6 && g.iter().all(|(_, n)| *n == 1),
                    "t{i}: {g:?}"
                );
            }
        }
        assert!(gone > 0 && gone <= 2000, "{gone}");
        assert_eq!(s.namespaces, 3001 - gone);
        c.check_invariants().unwrap();
    }

    #[test]
    fn history_in_parts_counts_what_the_whole_text_does() {
        let text: Vec<u32> = (0..1000u32).map(|i| (i * 13 + i / 9) % 41).collect();
        let (a, b) = (
            Cache::new(cfg(6, 1 << 20, false)).unwrap(),
            Cache::new(cfg(6, 1 << 20, false)).unwrap(),
        );
        a.add_history(std::slice::from_ref(&text), "x").unwrap();
        for s in (0..text.len()).step_by(77) {
            b.add_history_part(&text, s..(s + 77).min(text.len()), "x")
                .unwrap();
        }
        let (mut x, mut y) = (a.history_ngrams("x"), b.history_ngrams("x"));
        x.sort();
        y.sort();
        assert_eq!(x, y);
        assert!(b.add_history_part(&text, 5..2000, "x").is_err());
    }

    #[test]
    fn namespaces_do_not_share_outputs() {
        let c = Cache::new(cfg(4, 1 << 20, false)).unwrap();
        c.add_history(&[vec![7, 8, 9]], "a").unwrap();
        let x = RequestId::Int(1);
        let y = RequestId::Int(2);
        c.start_request(x.clone(), vec![7], "a").unwrap();
        c.start_request(y.clone(), vec![7], "b").unwrap();
        assert_eq!(c.draft(&x, 4, false).unwrap().tokens, vec![7, 8, 9]);
        assert_eq!(c.draft(&y, 4, false).unwrap().tokens, vec![7]);
        let s = c.stats();
        // "a" and "b"; the empty, unused "default" was dropped when they came.
        assert_eq!((s.hits, s.misses, s.namespaces), (1, 1, 2));
    }

    #[test]
    fn capacity_holds_with_a_huge_prompt_and_history() {
        let c = Cache::new(cfg(6, 500, true)).unwrap();
        let text: Vec<u32> = (0..3000u32).map(|i| (i * 31) % 97).collect();
        c.add_history(std::slice::from_ref(&text), "default")
            .unwrap();
        assert!(c.stats().nodes <= 500);
        c.start_request(RequestId::Int(1), text.clone(), "default")
            .unwrap();
        c.draft(&RequestId::Int(1), 8, true).unwrap();
        let s = c.stats();
        assert!(s.nodes <= 500, "{s:?}");
        assert_eq!(s.truncated_prompts, 1);
        c.extend(&RequestId::Int(1), &text[..200]).unwrap();
        c.check_invariants().unwrap();
        c.finish_request(&RequestId::Int(1), Some(true)).unwrap();
        c.check_invariants().unwrap();
        assert!(c.stats().nodes <= 500);
        assert_eq!(c.stats().prompt_nodes, 0);
    }

    #[test]
    fn finishing_releases_the_prompt() {
        let c = Cache::new(cfg(4, 10_000, true)).unwrap();
        let r = RequestId::Int(3);
        c.start_request(r.clone(), (0..100).collect(), "default")
            .unwrap();
        c.draft(&r, 2, true).unwrap();
        assert!(c.stats().prompt_nodes > 0);
        c.finish_request(&r, None).unwrap();
        c.check_invariants().unwrap();
        assert_eq!(c.stats().nodes, 0);
        assert_eq!(c.budget().used(), 0);
    }

    fn recycling(k: usize, slots: usize) -> Cache {
        Cache::new(Config {
            recycle_k: k,
            recycle_slots: slots,
            ..cfg(4, 1 << 20, false)
        })
        .unwrap()
    }

    #[test]
    fn recycled_predictions_draft_what_no_trie_holds() {
        let rid = RequestId::Int(1);
        let run = |c: &Cache| {
            c.start_request(rid.clone(), vec![100, 101], "default")
                .unwrap();
            // The target chose 7 after 101 (8 its second guess), then 9 after 7.
            c.extend_predicted(&rid, &[7, 9], &[7, 8, 9, 3], &[0.75, 0.25, 0.5, 0.5], 2)
                .unwrap();
            c.extend(&rid, &[5, 101]).unwrap();
            c.draft(&rid, 4, true).unwrap()
        };
        let c = recycling(4, 64);
        let d = run(&c);
        // 8 never followed 101 in any text: only the recycled row after 101 offers it.
        assert!(d.tokens[1..].contains(&8), "{d:?}");
        assert!(d.tokens[1..].contains(&7), "{d:?}");
        c.check_invariants().unwrap();
        // Two keys per row (the token alone, and after the one before it).
        assert_eq!(c.stats().recycled_keys, 4);
        let off = recycling(0, 64);
        let d = run(&off);
        assert_eq!(off.stats().recycled_keys, 0);
        assert!(!d.tokens[1..].contains(&8), "{d:?}");
    }

    #[test]
    fn recycled_rows_are_checked_and_kept_apart_by_namespace() {
        // Weight 1: the row's 0.9 outranks the trie's once-seen 3 (1/2).
        let c = Cache::new(Config {
            recycle_k: 2,
            recycle_slots: 16,
            recycle_weight: 1.0,
            ..cfg(4, 1 << 20, false)
        })
        .unwrap();
        let a = RequestId::Int(1);
        let b = RequestId::Int(2);
        c.start_request(a.clone(), vec![1, 2], "x").unwrap();
        c.start_request(b.clone(), vec![1, 2], "y").unwrap();
        for bad in [
            c.extend_predicted(&a, &[3], &[4], &[0.5, 0.5], 1),
            c.extend_predicted(&a, &[3], &[4, 5], &[0.5, 1.5], 2),
            c.extend_predicted(&a, &[3], &[], &[], 0),
            c.extend_predicted(&a, &[3], &[4], &[f32::NAN], 1),
        ] {
            assert!(matches!(bad, Err(Error::InvalidInput(_))), "{bad:?}");
        }
        // The row after token 2 (the one before the new token 3).
        c.extend_predicted(&a, &[3], &[4], &[0.9], 1).unwrap();
        c.extend(&a, &[9, 2]).unwrap();
        c.extend(&b, &[3, 9, 2]).unwrap();
        let da = c.draft(&a, 4, false).unwrap();
        let db = c.draft(&b, 4, false).unwrap();
        assert_eq!(da.tokens[1], 4, "{da:?}");
        assert!(!db.tokens.contains(&4), "{db:?}");
        c.check_invariants().unwrap();
    }

    #[test]
    fn a_recycled_token_is_continued_from_its_own_path() {
        // After 101 the text says 7; the target's row after 101 says 7 or 8, and 8 occurs in
        // the text only as "8 60 61". Node 8 (no trie continues "101 8") is matched afresh on
        // context + path: its child is 60, not what follows the context's own suffix (7).
        let c = recycling(2, 64);
        let rid = RequestId::Int(1);
        c.start_request(rid.clone(), vec![100, 101, 7, 9, 8, 60, 61, 5], "default")
            .unwrap();
        c.extend_predicted(&rid, &[101, 7], &[101, 3, 7, 8], &[0.9, 0.05, 0.5, 0.45], 2)
            .unwrap();
        c.extend(&rid, &[5, 101]).unwrap();
        let d = c.draft(&rid, 8, true).unwrap();
        let eight = (1..d.num_nodes())
            .find(|&i| d.tokens[i] == 8 && d.parents[i] == 0)
            .unwrap_or_else(|| panic!("no recycled 8 under the root: {d:?}"));
        let kids: Vec<u32> = (1..d.num_nodes())
            .filter(|&i| d.parents[i] == eight as i32)
            .map(|i| d.tokens[i])
            .collect();
        assert_eq!(kids.first(), Some(&60), "{d:?}");
    }
}
