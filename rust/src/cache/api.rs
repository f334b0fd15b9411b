//! `Cache`: the operations a serving loop calls (start, extend, draft, finish, histories).

use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use crate::draft::{mix, DraftTree, RecycleView, Sources};
use crate::error::{Error, Result};
use crate::evict::Budget;
use crate::pool::Pool;
use crate::recycle::{Recycled, ALONE};

use super::config::{Config, CHUNK_TOKENS, MAX_BUDGET};
use super::locks::{lock, panic_message, read, write};
use super::namespace::{check_namespace, read_nodes};
use super::request::{current, Cursors, PromptSlot, ReqState, Request, RequestId};
use super::shared::{Busy, Shared};

/// The n-gram cache of the whole serving process.
pub struct Cache {
    pub(super) shared: Arc<Shared>,
    pub(super) requests: RwLock<FxHashMap<RequestId, Arc<Request>>>,
    pub(super) pool: Option<Pool>,
    /// The `meta` text of the file this cache was loaded from (`persist::load`).
    pub(super) saved_meta: Option<String>,
}

/// Counters and sizes reported by `Cache::stats`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    /// Nodes stored or reserved by operations in progress: always <= `capacity_nodes`, and
    /// `history_nodes + own_nodes + corpus_nodes` when the cache is idle.
    pub nodes: u64,
    pub history_nodes: u64,
    /// Nodes of the live requests' own tries (their prompts, then their outputs).
    pub own_nodes: u64,
    pub capacity_nodes: u64,
    /// The byte budget (`Config::capacity_bytes`; 0: none).
    pub capacity_bytes: u64,
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
    /// Corpora loaded, and their nodes (not in `history_nodes` nor `own_nodes`).
    pub corpora: u64,
    pub corpus_nodes: u64,
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
            budget: Arc::new(Budget::new(cfg.node_capacity())),
            background: pool.as_ref().map(|p| Mutex::new(p.queue())),
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
            corpora: RwLock::new(Vec::new()),
            corpus_count: AtomicUsize::new(0),
            building_corpus: AtomicBool::new(false),
        });
        drop(shared.use_namespace("default"));
        Ok(Cache {
            shared,
            requests: RwLock::new(FxHashMap::default()),
            pool,
            saved_meta: None,
        })
    }

    pub fn config(&self) -> &Config {
        &self.shared.cfg
    }

    pub(super) fn request(&self, rid: &RequestId) -> Result<Arc<Request>> {
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
            state: Mutex::new(ReqState::new(
                prompt[prompt.len().saturating_sub(keep)..].to_vec(),
            )),
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
        let job = move || {
            shared.run_build(&ns, &text, &slot);
            drop(ns);
            // Drop our handle first: a trie of a finished request is freed before we report done.
            drop(slot);
        };
        self.run_job(Box::new(job), true);
        Ok(())
    }

    /// Runs `job` on the pool if `background` and there is one (counted as an operation in
    /// flight until it is done), else here.
    fn run_job(&self, job: Box<dyn FnOnce() + Send>, background: bool) {
        let shared = Arc::clone(&self.shared);
        shared.in_flight.fetch_add(1, Ordering::AcqRel);
        let job: Box<dyn FnOnce() + Send> = Box::new(move || {
            job();
            shared.op_seq.fetch_add(1, Ordering::AcqRel);
            shared.in_flight.fetch_sub(1, Ordering::AcqRel);
        });
        let inline = match self.pool.as_ref().filter(|_| background) {
            Some(pool) => pool.submit(job),
            None => Some(job),
        };
        if let Some(job) = inline {
            job();
        }
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

    pub(super) fn recycle(
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

    pub(super) fn extend_req(&self, req: &Request, tokens: &[u32]) -> Result<()> {
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
            if sh.cfg.history_weight > 0.0 {
                // At weight 0 drafts never read the shared history: nothing to count there.
                sh.count_history(&req.ns, st, chunk);
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

    pub(super) fn draft_req(
        &self,
        req: &Request,
        budget: usize,
        multi_branch: bool,
    ) -> Result<DraftTree> {
        // Busy: a draft may hold the own trie of a request finished meanwhile.
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
            own: Some(&p),
            history: Some(&h),
            own_weight: cfg.own_weight,
            history_weight: cfg.history_weight,
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
        let mut tree = src.draft(&tail, budget, multi_branch);
        drop(recycled);
        drop(h);
        drop(p);
        let corpora = self.corpora_serving(&req.ns.name);
        if !corpora.is_empty() {
            let mut drafts = vec![(tree, 1.0)];
            for c in &corpora {
                let src = Sources {
                    own: None,
                    history: Some(&c.trie),
                    own_weight: 0.0,
                    history_weight: 1.0,
                    max_depth: cfg.max_depth,
                    history_skip: None,
                    suffixes: [&[], &[]],
                    recycled: None,
                };
                drafts.push((src.draft(&tail, budget, multi_branch), cfg.corpus_weight));
            }
            tree = mix(&drafts, budget, multi_branch);
        }
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

    /// Ends a request: drops its own trie, or merges the prompt into the namespace's
    /// history first when `keep_prompt` (default: the configured `keep_prompt_as_history`).
    pub fn finish_request(&self, rid: &RequestId, keep_prompt: Option<bool>) -> Result<()> {
        let _busy = Busy::new(&self.shared);
        let req = write(&self.requests).remove(rid).ok_or_else(|| {
            Error::UnknownRequest(format!(
                "request {rid} is not live (never started or already finished)"
            ))
        })?;
        req.prompt.close();
        let read = self.shared.cfg.history_weight > 0.0;
        let keep = read && keep_prompt.unwrap_or(self.shared.cfg.keep_prompt_as_history);
        // (A draft may still hold the request: its state stays.)
        let (pending, before) = {
            let mut st = lock(&req.state);
            let st = &mut *st;
            (
                std::mem::take(&mut st.history_pending),
                std::mem::take(&mut st.history_pending_before),
            )
        };
        if keep || !pending.is_empty() {
            // What is left for the history: the tokens a compaction or a save held off, and
            // the prompt if kept. While they still hold the writers off, the pool counts it,
            // so finishing does not wait for them.
            let shared = Arc::clone(&self.shared);
            let ns = req.ns.share();
            let prompt = Arc::clone(&req.prompt_tokens);
            let job = move || {
                shared.count_history_later(&ns, &mut Cursors::stale(), &pending, before);
                if keep {
                    shared.add_history(&ns, &prompt);
                }
            };
            self.run_job(Box::new(job), req.ns.held_long());
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
}

/// `rows` rows of `k >= 1` predictions, probabilities in [0, 1].
pub(super) fn check_predictions(rows: usize, ids: &[u32], probs: &[f32], k: usize) -> Result<()> {
    // checked: a hostile k (2**63, say) must not wrap `rows * k` into a length that passes
    let want = rows.checked_mul(k);
    if k == 0 || want != Some(ids.len()) || want != Some(probs.len()) {
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

pub(super) fn check_budget(budget: usize) -> Result<()> {
    if !(1..=MAX_BUDGET).contains(&budget) {
        return Err(Error::InvalidInput(format!(
            "budget must be in 1..={MAX_BUDGET}, got {budget}"
        )));
    }
    Ok(())
}
