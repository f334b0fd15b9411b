//! What the cache reports and checks: statistics, invariants, the n-grams tests compare, and
//! the namespaces a save walks.

use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};

use crate::error::{Error, Result};
use crate::evict::Budget;
use crate::trie::Trie;

use super::api::{Cache, Stats};
use super::locks::{lock, read, write};
use super::namespace::Namespace;
use super::request::{OwnTrie, ReqState, Request, RequestId};
use super::shared::Busy;

impl Cache {
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
                s.own_nodes += t.nodes();
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
    pub fn own_ngrams(&self, rid: &RequestId) -> Result<Vec<(Vec<u32>, u32)>> {
        let _busy = Busy::new(&self.shared);
        let req = self.request(rid)?;
        let (own, st) = self.own_trie(&req)?;
        drop(st);
        let t = read(&own.trie);
        Ok(t.ngrams())
    }

    /// `req`'s own trie once built (waits for it) with every output counted into it, and
    /// the request's state, still locked.
    pub(super) fn own_trie<'r>(
        &self,
        req: &'r Request,
    ) -> Result<(Arc<OwnTrie>, MutexGuard<'r, ReqState>)> {
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
