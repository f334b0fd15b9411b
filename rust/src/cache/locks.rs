//! The lock helpers, and the order locks are taken in.
//!
//! Lock order, never reversed: request state -> the request's prompt slot -> the request's
//! own trie -> one namespace's writer right (`Namespace::writer`, taken by whoever writes
//! that history, and by a compaction or a save for their pass) -> that namespace's lock (a
//! draft reads its own trie, then the history; `extend` writes one trie at a time). Budget reservations, which may evict history, happen before a
//! trie lock is taken; nothing holding a namespace lock takes another lock but the
//! recycled-prediction table's (read, last, by drafts; its writers hold it alone). The name
//! map of namespaces comes before any history lock (and dropping a namespace only tries that
//! lock, never waits for it under the map lock); the eviction ring's mutex is held alone.
//! A poisoned lock is taken as it is: see `lock`.

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock means a panic was caught mid-operation; the structure is still
    // memory-safe and check_invariants reports any damage, so keep serving.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(super) fn read<T>(m: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|e| e.into_inner())
}

pub(super) fn write<T>(m: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|e| e.into_inner())
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
