//! A live request: its id, its own trie (built from its prompt, then fed its outputs), the
//! slot that trie appears in once built, and its cursors into each trie.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};

use crate::error::{Error, Result};
use crate::evict::Budget;
use crate::trie::Trie;

use super::locks::lock;
use super::namespace::NsUse;

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

/// A request's own trie: every n-gram of its prompt, then those ending at each of its
/// verified output tokens. Its nodes return to the budget when it is dropped.
pub struct OwnTrie {
    pub trie: RwLock<Trie>,
    pub(super) budget: Arc<Budget>,
    pub truncated: bool,
    /// Nodes its outputs added (bounded across requests: `Budget::own_outputs_fit`).
    pub(super) outputs: AtomicU64,
}

impl Drop for OwnTrie {
    fn drop(&mut self) {
        let t = self.trie.get_mut().unwrap_or_else(|e| e.into_inner());
        self.budget.release(t.nodes() + t.allowance);
        let outputs = *self.outputs.get_mut();
        self.budget.note_own_outputs(-(outputs as i64));
    }
}

/// Where an own trie appears once built; only its own request waits on it.
pub(super) struct PromptSlot {
    pub(super) state: Mutex<SlotState>,
    pub(super) ready: Condvar,
    pub(super) cancel: AtomicBool,
}

pub(super) enum SlotState {
    Pending,
    Ready(Arc<OwnTrie>),
    Failed(String),
    /// The request finished: the trie was dropped (or never stored).
    Closed,
}

impl PromptSlot {
    pub(super) fn new() -> Self {
        PromptSlot {
            state: Mutex::new(SlotState::Pending),
            ready: Condvar::new(),
            cancel: AtomicBool::new(false),
        }
    }

    /// Stores the built trie, unless the request finished meanwhile (then it is dropped here).
    pub(super) fn set(&self, v: std::result::Result<OwnTrie, String>) {
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

    pub(super) fn wait(&self) -> Result<Arc<OwnTrie>> {
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
    pub(super) fn peek(&self) -> Option<Arc<OwnTrie>> {
        match &*lock(&self.state) {
            SlotState::Ready(p) => Some(Arc::clone(p)),
            _ => None,
        }
    }

    /// `Ok(trie)` if built, `Err(true)` while still building, `Err(false)` if there will be
    /// none (failed or closed); one lock, so the answer cannot change between two looks.
    pub(super) fn poll(&self) -> std::result::Result<Arc<OwnTrie>, bool> {
        match &*lock(&self.state) {
            SlotState::Ready(p) => Ok(Arc::clone(p)),
            SlotState::Pending => Err(true),
            _ => Err(false),
        }
    }

    pub(super) fn is_pending(&self) -> bool {
        matches!(*lock(&self.state), SlotState::Pending)
    }

    /// Drops the trie (a draft in progress keeps its own reference until it returns).
    pub(super) fn close(&self) {
        self.cancel.store(true, Ordering::Relaxed);
        let old = std::mem::replace(&mut *lock(&self.state), SlotState::Closed);
        drop(old);
        self.ready.notify_all();
    }
}

/// Where the n-grams ending at a request's last counted token sit in one trie, so counting
/// the next token's n-grams needs no walk from the root.
#[derive(Clone)]
pub(super) struct Cursors {
    /// `nodes[k]`: node of the n-gram of length k+1 ending at the last counted token.
    pub(super) nodes: Vec<u32>,
    /// Trie epoch the nodes were taken at (`u64::MAX`: rebuild before use).
    pub(super) epoch: u64,
    /// The next token's nodes while they are found (kept to reuse its allocation).
    pub(super) next: Vec<u32>,
}

/// Cursor nodes taken at trie epoch `taken`, if that is still the trie's epoch `now`.
pub(super) fn current(nodes: &[u32], taken: u64, now: u64) -> &[u32] {
    if taken == now {
        nodes
    } else {
        &[]
    }
}

impl Cursors {
    pub(super) fn stale() -> Self {
        Cursors {
            nodes: Vec::new(),
            epoch: u64::MAX,
            next: Vec::new(),
        }
    }
}

pub(super) struct ReqState {
    /// The last `max_depth - 1` (or more) tokens of prompt + outputs.
    pub(super) tail: Vec<u32>,
    /// Into the namespace's history.
    pub(super) history: Cursors,
    /// Into the request's own trie.
    pub(super) own: Cursors,
    /// Verified tokens that arrived while the own trie was still being built (counted into
    /// it when it is ready), and the `max_depth - 1` context tokens before the first of them.
    pub(super) unindexed: Vec<u32>,
    pub(super) unindexed_before: Vec<u32>,
    /// Verified tokens not yet counted into the history, which a compaction or a save held
    /// off (`Shared::count_history`), and the context tokens before the first of them.
    pub(super) history_pending: Vec<u32>,
    pub(super) history_pending_before: Vec<u32>,
}

impl ReqState {
    /// A request's state before any step: its context ends with `tail`.
    pub(super) fn new(tail: Vec<u32>) -> Self {
        ReqState {
            tail,
            history: Cursors::stale(),
            own: Cursors::stale(),
            unindexed: Vec::new(),
            unindexed_before: Vec::new(),
            history_pending: Vec::new(),
            history_pending_before: Vec::new(),
        }
    }
}

pub(super) struct Request {
    pub(super) ns: NsUse,
    pub(super) prompt_tokens: Arc<Vec<u32>>,
    pub(super) prompt: Arc<PromptSlot>,
    pub(super) state: Mutex<ReqState>,
}
