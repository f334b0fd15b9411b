//! A namespace: one tenant's shared history, and a use of it that keeps it alive.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use crate::error::{Error, Result};
use crate::trie::Trie;

use super::config::MAX_NAMESPACE_BYTES;
use super::locks::read;

pub struct Namespace {
    pub name: String,
    /// Unique over the cache's life: the recycled predictions' key for this namespace.
    pub id: u64,
    pub history: RwLock<Trie>,
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
    /// Bytes it holds: its history and its own bookkeeping.
    pub(super) fn bytes(&self, history: &Trie) -> u64 {
        (history.bytes() + std::mem::size_of::<Namespace>() + self.name.capacity()) as u64
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
