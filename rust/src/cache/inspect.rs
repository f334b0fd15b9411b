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
            capacity_bytes: self.shared.cfg.capacity_bytes,
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
        for c in read(&self.shared.corpora).iter() {
            s.corpora += 1;
            s.corpus_nodes += c.trie.nodes();
            s.bytes += c.trie.bytes() as u64;
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
        for c in read(&self.shared.corpora).iter() {
            c.trie
                .check()
                .map_err(|e| Error::Invariant(format!("corpus {:?}: {e}", c.id)))?;
            nodes += c.trie.nodes();
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
        let writing = ns.writing();
        let old = std::mem::replace(&mut *write(&ns.history), trie);
        drop(writing);
        self.shared.budget.release(old.nodes() + old.allowance);
    }

    pub(crate) fn budget(&self) -> &Budget {
        &self.shared.budget
    }

    /// The `meta` text of the save file this cache was loaded from (None: not loaded, or
    /// saved without one).
    pub fn saved_meta(&self) -> Option<&str> {
        self.saved_meta.as_deref()
    }

    pub(crate) fn set_saved_meta(&mut self, meta: Option<String>) {
        self.saved_meta = meta;
    }
}

/// What `Cache::time_compaction_stall` measured.
pub struct CompactionStall {
    /// The compaction's wall time, and the history's slots and live nodes before it.
    pub compaction_ns: u64,
    pub slots: u64,
    pub live: u64,
    /// Wall time of each step that overlapped the compaction.
    pub steps_ns: Vec<u64>,
}

impl Cache {
    /// Benchmark helper: sweeps `namespace`'s history until its free slots outnumber its
    /// live nodes (what makes eviction compact it), then compacts it on a second thread
    /// while this one runs `step(rid, [token], budget)` over `rids` and `tokens` back to
    /// back. `mode`: `"beside"` (as eviction compacts), `"in place"` (the compaction holds
    /// the history's write lock for its whole pass, as before compactions were built beside
    /// the history), or `"none"` (no compaction: the other thread sleeps 40 ms), the last
    /// two for comparison.
    pub fn time_compaction_stall(
        &self,
        namespace: &str,
        rids: &[RequestId],
        tokens: &[u32],
        budget: usize,
        mode: &str,
    ) -> Result<CompactionStall> {
        if rids.is_empty() || tokens.is_empty() {
            return Err(Error::InvalidInput(
                "rids and tokens must not be empty".into(),
            ));
        }
        if !["beside", "in place", "none"].contains(&mode) {
            return Err(Error::InvalidInput(format!(
                "mode must be \"beside\", \"in place\" or \"none\", got {mode:?}"
            )));
        }
        let ns = read(&self.shared.namespaces)
            .get(namespace)
            .cloned()
            .ok_or_else(|| Error::InvalidInput(format!("no namespace {namespace:?}")))?;
        loop {
            let h = read(&ns.history);
            if h.free_slots() >= h.nodes() || h.nodes() == 0 {
                break;
            }
            drop(h);
            let writing = ns.writing();
            let freed = write(&ns.history).sweep(1 << 20, u64::MAX);
            drop(writing);
            self.shared.budget.release(freed);
        }
        let (slots, live) = {
            let h = read(&ns.history);
            (u64::from(h.arena.slots()), h.nodes())
        };
        let done = std::sync::atomic::AtomicBool::new(false);
        let start = std::sync::Barrier::new(2);
        let mut steps = Vec::new();
        let (span, result) = std::thread::scope(|s| {
            let compaction = s.spawn(|| {
                start.wait();
                let t0 = std::time::Instant::now();
                match mode {
                    "beside" => {
                        ns.compact_history();
                    }
                    "in place" => {
                        let _writing = ns.writing();
                        write(&ns.history).compact();
                    }
                    _ => std::thread::sleep(std::time::Duration::from_millis(40)),
                }
                let t1 = std::time::Instant::now();
                done.store(true, Ordering::Release);
                (t0, t1)
            });
            start.wait();
            let mut i = 0;
            let mut result = Ok(());
            while !done.load(Ordering::Acquire) {
                let t0 = std::time::Instant::now();
                let step = self.step(
                    &rids[i % rids.len()],
                    &tokens[i % tokens.len()..][..1],
                    budget,
                    true,
                );
                steps.push((t0, std::time::Instant::now()));
                if let Err(e) = step {
                    result = Err(e);
                    break;
                }
                i += 1;
            }
            (compaction.join().expect("compaction panicked"), result)
        });
        result?;
        let (c0, c1) = span;
        Ok(CompactionStall {
            compaction_ns: (c1 - c0).as_nanos() as u64,
            slots,
            live,
            steps_ns: steps
                .iter()
                .filter(|(a, b)| *b > c0 && *a < c1)
                .map(|(a, b)| (*b - *a).as_nanos() as u64)
                .collect(),
        })
    }
}
