//! A namespace: one tenant's shared history, and a use of it that keeps it alive.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, TryLockError};

use crate::error::{Error, Result};
use crate::trie::Trie;

use super::config::MAX_NAMESPACE_BYTES;
use super::locks::{lock, read, write};

/// Free slots a history arena may keep beyond its live nodes before it is compacted.
pub(super) const COMPACT_SLACK: u64 = 64;

pub struct Namespace {
    pub name: String,
    /// Unique over the cache's life: the recycled predictions' key for this namespace.
    pub id: u64,
    /// Read by drafts; written only by a holder of `writer`.
    pub history: RwLock<Trie>,
    /// Held by every writer of `history` while it writes, and by a compaction or a save for
    /// their whole pass, while they hold `history` only to read it (and a compaction, at the
    /// end, to swap the compacted trie in). Writers queue here, not on `history`: std's
    /// RwLock lets no new reader in while a writer waits, so a writer queued on it behind a
    /// long read would stall every draft of the namespace.
    pub(super) writer: Mutex<()>,
    /// Compactions and saves holding or waiting for `writer`: while any is, steps leave
    /// their tokens for the history to a later step (`ReqState::history_pending`) instead
    /// of waiting.
    long_holds: AtomicUsize,
    /// A compaction of it is queued on the pool.
    pub(super) compaction_queued: AtomicBool,
    /// Live requests and running operations using it: only an unused namespace is dropped.
    pub(super) users: AtomicUsize,
    /// `Shared::tick` of its last use, and of its last entry into the eviction ring (used
    /// since it entered: it gets a second chance before its history is evicted).
    pub(super) used_at: AtomicU64,
    pub(super) queued_at: AtomicU64,
    /// Set once it left the name map (its history released); ring entries of it are stale.
    pub(super) dropped: AtomicBool,
}

impl Namespace {
    pub(super) fn new(name: &str, id: u64, now: u64) -> Self {
        Namespace {
            name: name.to_owned(),
            id,
            history: RwLock::new(Trie::new()),
            writer: Mutex::new(()),
            long_holds: AtomicUsize::new(0),
            compaction_queued: AtomicBool::new(false),
            users: AtomicUsize::new(0),
            used_at: AtomicU64::new(now),
            queued_at: AtomicU64::new(now),
            dropped: AtomicBool::new(false),
        }
    }

    /// The right to write the history (taken before its write lock).
    pub(super) fn writing(&self) -> MutexGuard<'_, ()> {
        lock(&self.writer)
    }

    /// The right to write the history, unless a compaction or a save holds the writers off
    /// (`None`). Never queues behind them: while another writer holds the right, it spins
    /// (writers hold it for microseconds) and looks at the hold again.
    pub(super) fn writing_unless_held(&self) -> Option<MutexGuard<'_, ()>> {
        for spins in 0u32.. {
            if self.held_long() {
                return None;
            }
            match self.writer.try_lock() {
                Ok(w) => return Some(w),
                Err(TryLockError::Poisoned(e)) => return Some(e.into_inner()),
                Err(TryLockError::WouldBlock) if spins < 64 => std::hint::spin_loop(),
                Err(TryLockError::WouldBlock) => std::thread::yield_now(),
            }
        }
        unreachable!("u32 spins run out only after 4e9 tries")
    }

    /// Holds off the history's writers for a long read (a compaction, a save); drafts go on.
    pub(crate) fn hold_long(&self) -> LongHold<'_> {
        // Flag first: a step that sees it leaves its tokens for later rather than queue
        // behind this hold.
        self.long_holds.fetch_add(1, Ordering::AcqRel);
        LongHold {
            ns: self,
            _writer: lock(&self.writer),
        }
    }

    /// Whether eviction left the history more free slots than live nodes (plus
    /// `COMPACT_SLACK`), so that compacting it gives memory back.
    pub(super) fn wants_compaction(&self) -> bool {
        let h = read(&self.history);
        h.free_slots() > h.nodes() + COMPACT_SLACK
    }

    /// Compacts the history if it `wants_compaction`. The writers are held off meanwhile
    /// (steps leave their tokens for later), but drafts go on reading the history: it is
    /// compacted into a copy under its read lock, and the write lock is held only to swap
    /// the copy in. Returns whether it compacted.
    pub(super) fn compact_history(&self) -> bool {
        let hold = self.hold_long();
        let fresh = {
            let h = read(&self.history);
            (h.free_slots() > h.nodes() + COMPACT_SLACK).then(|| h.compacted())
        };
        let Some(fresh) = fresh else {
            return false;
        };
        let old = std::mem::replace(&mut *write(&self.history), fresh);
        drop(hold);
        drop(old); // the old arena is freed outside every lock
        true
    }

    /// Whether a compaction or a save holds off the writers now.
    pub(super) fn held_long(&self) -> bool {
        self.long_holds.load(Ordering::Acquire) > 0
    }

    /// Bytes it holds: its history and its own bookkeeping.
    pub(super) fn bytes(&self, history: &Trie) -> u64 {
        (history.bytes() + std::mem::size_of::<Namespace>() + self.name.capacity()) as u64
    }
}

/// `Namespace::hold_long`'s guard.
pub(crate) struct LongHold<'a> {
    ns: &'a Namespace,
    _writer: MutexGuard<'a, ()>,
}

impl Drop for LongHold<'_> {
    fn drop(&mut self) {
        self.ns.long_holds.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One use of a namespace (a live request holds one): while any exists, the namespace
/// stays in the name map, so its history is never dropped under a writer.
pub(crate) struct NsUse(pub(super) Arc<Namespace>);

impl std::ops::Deref for NsUse {
    type Target = Namespace;
    fn deref(&self) -> &Namespace {
        &self.0
    }
}

impl NsUse {
    /// Another use of the same namespace (safe without the map lock: this one keeps the
    /// count above 0 meanwhile).
    pub(super) fn share(&self) -> NsUse {
        self.0.users.fetch_add(1, Ordering::AcqRel);
        NsUse(Arc::clone(&self.0))
    }
}

impl Drop for NsUse {
    fn drop(&mut self) {
        self.0.users.fetch_sub(1, Ordering::AcqRel);
    }
}

pub(super) fn read_nodes(ns: &Namespace) -> u64 {
    read(&ns.history).nodes()
}

pub(super) fn check_namespace(name: &str) -> Result<()> {
    if name.len() > MAX_NAMESPACE_BYTES {
        return Err(Error::InvalidInput(format!(
            "namespace names are at most {MAX_NAMESPACE_BYTES} bytes, got {}",
            name.len()
        )));
    }
    Ok(())
}
