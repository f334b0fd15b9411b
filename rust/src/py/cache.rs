//! `lookahead._core.Cache`: thin methods over `crate::Cache`. Every call releases the GIL and
//! catches panics, so a bug surfaces as `lookahead.InternalError`, never an abort.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use numpy::{PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray1};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::args;
use super::draft::{to_py, PyDraft};
use super::errors::to_pyerr;
use crate::cache::{panic_message, Cache, Config, CorpusInfo, MAX_BUDGET};
use crate::error::{Error, Result};

/// Most entries (requests x width) of one `draft_batch` result: its arrays are allocated up
/// front, so an absurd batch is refused rather than aborting on memory.
const MAX_BATCH_ENTRIES: usize = 1 << 28;
/// Most drafts one `_time_drafts` call may time (its two result arrays are allocated first).
const MAX_TIMED_DRAFTS: usize = 100_000_000;
use crate::trie::Trie;

/// Tokens one GIL-free stretch of `add_history` / `extend` indexes before the binding
/// checks for Ctrl-C (about 0.1 s of work on one core).
const INTERRUPTIBLE_TOKENS: usize = 1 << 18;

/// Runs `f` without the GIL; a panic becomes `Error::Internal`.
fn run<T: Send>(py: Python<'_>, f: impl FnOnce() -> Result<T> + Send) -> PyResult<T> {
    py.detach(|| {
        catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|e| {
            Err(Error::Internal(format!(
                "panic in lookahead core: {}",
                panic_message(&e)
            )))
        })
    })
    .map_err(|e| to_pyerr(py, e))
}

/// `cfg` as the dict `LookaheadCache.config` returns (and `DEFAULTS` is, for the default).
pub(super) fn config_dict<'py>(py: Python<'py>, c: &Config) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("max_depth", c.max_depth)?;
    d.set_item("capacity_nodes", c.capacity_nodes)?;
    d.set_item("own_weight", c.own_weight)?;
    d.set_item("history_weight", c.history_weight)?;
    d.set_item("keep_prompt_as_history", c.keep_prompt_as_history)?;
    d.set_item("background_indexing", c.background_indexing)?;
    d.set_item("index_threads", c.index_threads)?;
    d.set_item("history_skip", c.history_skip)?;
    d.set_item("recycle_k", c.recycle_k)?;
    d.set_item("recycle_slots", c.recycle_slots)?;
    d.set_item("recycle_weight", c.recycle_weight)?;
    d.set_item("corpus_weight", c.corpus_weight)?;
    d.set_item("capacity_bytes", c.capacity_bytes)?;
    Ok(d)
}

/// A draft's optional bounds from Python (`vocab` in [1, 2**32], `max_depth` >= 0); None when
/// neither is given.
fn limits(
    vocab: Option<&Bound<'_, PyAny>>,
    max_depth: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<(u64, usize)>> {
    let vocab = args::bound(vocab, "vocab", 1, 1 << 32)?;
    let depth = args::bound(max_depth, "max_depth", 0, i64::from(u32::MAX))?;
    Ok((vocab.is_some() || depth.is_some()).then(|| {
        // Both are in range, so non-negative: the casts keep their values.
        let depth = depth.map_or(usize::MAX, |d| usize::try_from(d).unwrap_or(usize::MAX));
        (vocab.map_or(1 << 32, |v| v as u64), depth)
    }))
}

/// `d` pruned to `limits` (`DraftTree::prune`), if any.
fn pruned(d: &mut crate::draft::DraftTree, limits: Option<(u64, usize)>) {
    if let Some((vocab, depth)) = limits {
        d.prune(vocab, depth);
    }
}

fn corpus_dict<'py>(py: Python<'py>, c: &CorpusInfo) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("id", &c.id)?;
    d.set_item("scope", &c.scope)?;
    d.set_item("tokens", c.tokens)?;
    d.set_item("nodes", c.nodes)?;
    d.set_item("bytes", c.bytes)?;
    d.set_item("cut", c.cut)?;
    Ok(d)
}

#[pyclass(name = "Cache", module = "lookahead._core", frozen)]
pub struct PyCache {
    inner: Cache,
}

#[pymethods]
impl PyCache {
    #[new]
    #[allow(clippy::too_many_arguments)]
    // Every knob is required: the defaults live in `Config::default()` alone (`DEFAULTS`),
    // which the Python wrapper's signature reads.
    #[pyo3(signature = (max_depth, capacity_nodes, own_weight, history_weight, keep_prompt_as_history, background_indexing, index_threads, history_skip, recycle_k, recycle_slots, recycle_weight, corpus_weight, capacity_bytes))]
    fn new(
        py: Python<'_>,
        max_depth: usize,
        capacity_nodes: u64,
        own_weight: f64,
        history_weight: f64,
        keep_prompt_as_history: bool,
        background_indexing: bool,
        index_threads: usize,
        history_skip: Option<(usize, usize)>,
        recycle_k: usize,
        recycle_slots: usize,
        recycle_weight: f64,
        corpus_weight: f64,
        capacity_bytes: u64,
    ) -> PyResult<Self> {
        let cfg = Config {
            corpus_weight,
            capacity_bytes,
            recycle_k,
            recycle_slots,
            recycle_weight,
            max_depth,
            capacity_nodes,
            own_weight,
            history_weight,
            keep_prompt_as_history,
            background_indexing,
            index_threads,
            history_skip,
        };
        Cache::new(cfg)
            .map(|inner| PyCache { inner })
            .map_err(|e| to_pyerr(py, e))
    }

    /// The configuration as a dict.
    fn config<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        config_dict(py, self.inner.config())
    }

    fn start_request(
        &self,
        py: Python<'_>,
        rid: &Bound<'_, PyAny>,
        prompt: &Bound<'_, PyAny>,
        namespace: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let prompt = args::token_ids(prompt, "prompt_ids")?;
        if prompt.is_empty() {
            return Err(to_pyerr(
                py,
                Error::InvalidInput("prompt_ids must hold at least one token".into()),
            ));
        }
        let rid = args::rid(rid)?;
        let namespace = args::namespace(namespace)?;
        run(py, || self.inner.start_request(rid, prompt, &namespace))
    }

    fn extend(
        &self,
        py: Python<'_>,
        rid: &Bound<'_, PyAny>,
        tokens: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let rid = args::rid(rid)?;
        let tokens = args::token_ids(tokens, "new_token_ids")?;
        if tokens.len() <= INTERRUPTIBLE_TOKENS {
            return run(py, || self.inner.extend(&rid, &tokens));
        }
        // Extending in parts counts exactly what one call does; Ctrl-C is checked between.
        for part in tokens.chunks(INTERRUPTIBLE_TOKENS) {
            run(py, || self.inner.extend(&rid, part))?;
            py.check_signals()?;
        }
        Ok(())
    }

    /// `extend` with the target's top-`k` predictions of each new token: `ids` (uint32) and
    /// `probs` (float32), C-contiguous, `len(tokens) * k` each, row by row.
    fn extend_predicted(
        &self,
        py: Python<'_>,
        rid: &Bound<'_, PyAny>,
        tokens: &Bound<'_, PyAny>,
        ids: PyReadonlyArray1<'_, u32>,
        probs: PyReadonlyArray1<'_, f32>,
        k: usize,
    ) -> PyResult<()> {
        let rid = args::rid(rid)?;
        let tokens = args::token_ids(tokens, "new_token_ids")?;
        let (ids, probs) = (ids.as_slice()?, probs.as_slice()?);
        run(py, || {
            self.inner.extend_predicted(&rid, &tokens, ids, probs, k)
        })
    }

    /// `Cache::recycle_after`; `ids` / `probs` as in `extend_predicted`.
    #[allow(clippy::too_many_arguments)]
    fn recycle_after(
        &self,
        py: Python<'_>,
        rid: &Bound<'_, PyAny>,
        toks: &Bound<'_, PyAny>,
        after: Option<&Bound<'_, PyAny>>,
        ids: PyReadonlyArray1<'_, u32>,
        probs: PyReadonlyArray1<'_, f32>,
        k: usize,
    ) -> PyResult<()> {
        let rid = args::rid(rid)?;
        let toks = args::token_ids(toks, "token_ids")?;
        let after = after.map(|a| args::token_ids(a, "after")).transpose()?;
        let (ids, probs) = (ids.as_slice()?, probs.as_slice()?);
        run(py, || {
            self.inner
                .recycle_after(&rid, &toks, after.as_deref(), ids, probs, k)
        })
    }

    /// `extend` for many requests in one call (one GIL release).
    fn extend_batch(
        &self,
        py: Python<'_>,
        rids: Vec<Bound<'_, PyAny>>,
        tokens: &Bound<'_, PyAny>,
        lengths: Vec<usize>,
    ) -> PyResult<()> {
        let ids = rids.iter().map(args::rid).collect::<PyResult<Vec<_>>>()?;
        let tokens = args::token_ids(tokens, "new_token_ids")?;
        run(py, || self.inner.extend_batch(&ids, &tokens, &lengths))
    }

    /// A draft, pruned (`DraftTree::prune`) to ids below `vocab` and to `max_depth` levels
    /// below the root where given.
    #[pyo3(signature = (rid, budget, multi_branch, vocab=None, max_depth=None))]
    fn draft<'py>(
        &self,
        py: Python<'py>,
        rid: &Bound<'_, PyAny>,
        budget: &Bound<'_, PyAny>,
        multi_branch: &Bound<'_, PyAny>,
        vocab: Option<&Bound<'_, PyAny>>,
        max_depth: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Bound<'py, PyDraft>> {
        let rid = args::rid(rid)?;
        let budget = args::budget(budget)?;
        let multi_branch = args::multi_branch(multi_branch)?;
        let limits = limits(vocab, max_depth)?;
        let d = run(py, || {
            let mut d = self.inner.draft(&rid, budget, multi_branch)?;
            pruned(&mut d, limits);
            Ok(d)
        })?;
        to_py(py, &d)
    }

    /// `extend` then `draft` in one call (one GIL release); nothing is extended when an
    /// argument is bad.
    #[pyo3(signature = (rid, tokens, budget, multi_branch, vocab=None, max_depth=None))]
    #[allow(clippy::too_many_arguments)]
    fn step<'py>(
        &self,
        py: Python<'py>,
        rid: &Bound<'_, PyAny>,
        tokens: &Bound<'_, PyAny>,
        budget: &Bound<'_, PyAny>,
        multi_branch: &Bound<'_, PyAny>,
        vocab: Option<&Bound<'_, PyAny>>,
        max_depth: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Bound<'py, PyDraft>> {
        let rid = args::rid(rid)?;
        let tokens = args::token_ids(tokens, "new_token_ids")?;
        let budget = args::budget(budget)?;
        let multi_branch = args::multi_branch(multi_branch)?;
        let limits = limits(vocab, max_depth)?;
        let d = run(py, || {
            let mut d = self.inner.step(&rid, &tokens, budget, multi_branch)?;
            pruned(&mut d, limits);
            Ok(d)
        })?;
        to_py(py, &d)
    }

    /// Returns (tokens [B, W], parents [B, W], scores [B, W], num_nodes [B], matched [B, W]),
    /// W = budget + 1.
    #[allow(clippy::type_complexity)]
    #[pyo3(signature = (rids, budget, multi_branch, threads=1, width=None, pad_parent=-1))]
    #[allow(clippy::too_many_arguments)]
    fn draft_batch<'py>(
        &self,
        py: Python<'py>,
        rids: Vec<Bound<'py, PyAny>>,
        budget: &Bound<'py, PyAny>,
        multi_branch: &Bound<'py, PyAny>,
        threads: usize,
        width: Option<usize>,
        pad_parent: i32,
    ) -> PyResult<(
        Bound<'py, PyArray2<i32>>,
        Bound<'py, PyArray2<i32>>,
        Bound<'py, PyArray2<f32>>,
        Bound<'py, PyArray1<i32>>,
        Bound<'py, PyArray2<u8>>,
    )> {
        let ids = rids.iter().map(args::rid).collect::<PyResult<Vec<_>>>()?;
        let budget = args::budget(budget)?;
        let multi_branch = args::multi_branch(multi_branch)?;
        let b = ids.len();
        let w = budget.saturating_add(1);
        let w = match width {
            None => w,
            Some(x) if (w..=MAX_BUDGET + 1).contains(&x) => x,
            Some(x) => {
                return Err(to_pyerr(
                    py,
                    Error::InvalidInput(format!(
                        "width must be in [budget + 1, {}], got {x} (budget {budget})",
                        MAX_BUDGET + 1
                    )),
                ))
            }
        };
        if !(-1..=0).contains(&pad_parent) {
            return Err(to_pyerr(
                py,
                Error::InvalidInput(format!("pad_parent must be -1 or 0, got {pad_parent}")),
            ));
        }
        if b.saturating_mul(w) > MAX_BATCH_ENTRIES {
            return Err(to_pyerr(
                py,
                Error::InvalidInput(format!(
                    "{b} requests x width {w} exceed {MAX_BATCH_ENTRIES} draft entries"
                )),
            ));
        }
        let (tok, par, sc, num, mat) = run(py, || {
            let trees = self
                .inner
                .draft_batch(&ids, budget, multi_branch, threads)?;
            let mut tok = vec![0i32; b * w];
            let mut par = vec![pad_parent; b * w];
            let mut sc = vec![0f32; b * w];
            let mut num = vec![0i32; b];
            let mut mat = vec![0u8; b * w];
            for (i, t) in trees.iter().enumerate() {
                let n = t.num_nodes();
                for (j, &x) in t.tokens.iter().enumerate() {
                    tok[i * w + j] = x as i32;
                }
                par[i * w..i * w + n].copy_from_slice(&t.parents);
                sc[i * w..i * w + n].copy_from_slice(&t.scores);
                mat[i * w..i * w + n].copy_from_slice(&t.matched);
                num[i] = n as i32;
            }
            Ok((tok, par, sc, num, mat))
        })?;
        let shape = [b, w];
        Ok((
            PyArray1::from_vec(py, tok).reshape(shape)?,
            PyArray1::from_vec(py, par).reshape(shape)?,
            PyArray1::from_vec(py, sc).reshape(shape)?,
            PyArray1::from_vec(py, num),
            PyArray1::from_vec(py, mat).reshape(shape)?,
        ))
    }

    #[pyo3(signature = (rid, keep_prompt=None))]
    fn finish_request(
        &self,
        py: Python<'_>,
        rid: &Bound<'_, PyAny>,
        keep_prompt: Option<bool>,
    ) -> PyResult<()> {
        let rid = args::rid(rid)?;
        run(py, || self.inner.finish_request(&rid, keep_prompt))
    }

    fn add_history(
        &self,
        py: Python<'_>,
        corpus: Vec<Bound<'_, PyAny>>,
        namespace: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let texts = corpus
            .iter()
            .enumerate()
            .map(|(i, t)| args::token_ids(t, &format!("corpus[{i}]")))
            .collect::<PyResult<Vec<_>>>()?;
        let namespace = args::namespace(namespace)?;
        // Part by part, checking for Ctrl-C in between: a 20M-token corpus stops within
        // a fraction of a second of the signal, not when it is all indexed.
        for text in &texts {
            for start in (0..text.len()).step_by(INTERRUPTIBLE_TOKENS) {
                let part = start..(start + INTERRUPTIBLE_TOKENS).min(text.len());
                run(py, || self.inner.add_history_part(text, part, &namespace))?;
                py.check_signals()?;
            }
        }
        Ok(())
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = run(py, || Ok(self.inner.stats()))?;
        let d = PyDict::new(py);
        d.set_item("nodes", s.nodes)?;
        d.set_item("history_nodes", s.history_nodes)?;
        d.set_item("own_nodes", s.own_nodes)?;
        d.set_item("capacity_nodes", s.capacity_nodes)?;
        d.set_item("capacity_bytes", s.capacity_bytes)?;
        d.set_item("bytes", s.bytes)?;
        d.set_item("live_requests", s.live_requests)?;
        d.set_item("pending_prompts", s.pending_prompts)?;
        d.set_item("namespaces", s.namespaces)?;
        d.set_item("hits", s.hits)?;
        d.set_item("misses", s.misses)?;
        d.set_item("evicted_nodes", s.evicted_nodes)?;
        d.set_item("truncated_prompts", s.truncated_prompts)?;
        d.set_item("recycled_keys", s.recycled_keys)?;
        d.set_item("corpora", s.corpora)?;
        d.set_item("corpus_nodes", s.corpus_nodes)?;
        Ok(d)
    }

    #[pyo3(signature = (path, meta=None))]
    fn save(&self, py: Python<'_>, path: std::path::PathBuf, meta: Option<String>) -> PyResult<()> {
        run(py, || {
            crate::persist::save(&self.inner, &path, meta.as_deref())
        })
    }

    /// The `meta` text of the file this cache was loaded from, or None.
    fn saved_meta(&self) -> Option<String> {
        self.inner.saved_meta().map(str::to_owned)
    }

    /// Builds corpus `id` from `documents` (token lists; no n-gram spans two of them) and
    /// publishes it; `scope`: the namespace it serves (None: all). Ctrl-C is checked between
    /// parts; an interrupted or failed build publishes nothing.
    #[pyo3(signature = (id, documents, scope=None))]
    fn add_corpus<'py>(
        &self,
        py: Python<'py>,
        id: String,
        documents: Vec<Bound<'py, PyAny>>,
        scope: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let docs = documents
            .iter()
            .enumerate()
            .map(|(i, t)| args::token_ids(t, &format!("documents[{i}]")))
            .collect::<PyResult<Vec<_>>>()?;
        let scope = scope.map(args::namespace).transpose()?;
        let mut build = run(py, || self.inner.begin_corpus(&id, scope.as_deref()))?;
        'docs: for text in &docs {
            for start in (0..text.len()).step_by(INTERRUPTIBLE_TOKENS) {
                let part = start..(start + INTERRUPTIBLE_TOKENS).min(text.len());
                if !run(py, || build.add_part(text, part))? {
                    break 'docs;
                }
                py.check_signals()?;
            }
        }
        let info = run(py, || self.inner.commit_corpus(build))?;
        corpus_dict(py, &info)
    }

    /// Removes corpus `id`; returns whether it existed.
    fn remove_corpus(&self, py: Python<'_>, id: String) -> PyResult<bool> {
        run(py, || Ok(self.inner.remove_corpus(&id)))
    }

    /// Moves every corpus into `to` (same configuration) where it fits; returns their ids.
    fn move_corpora_to(&self, py: Python<'_>, to: &PyCache) -> PyResult<Vec<String>> {
        run(py, || Ok(self.inner.move_corpora_to(&to.inner)))
    }

    /// The corpora, in the order they were added, as dicts.
    fn corpora<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let all = run(py, || Ok(self.inner.corpora()))?;
        all.iter().map(|c| corpus_dict(py, c)).collect()
    }

    #[staticmethod]
    #[pyo3(signature = (path, background_indexing=None, index_threads=None, allow_legacy=false))]
    fn load(
        py: Python<'_>,
        path: std::path::PathBuf,
        background_indexing: Option<bool>,
        index_threads: Option<usize>,
        allow_legacy: bool,
    ) -> PyResult<Self> {
        run(py, || {
            crate::persist::load(&path, background_indexing, index_threads, allow_legacy)
        })
        .map(|inner| PyCache { inner })
    }

    fn check_invariants(&self, py: Python<'_>) -> PyResult<()> {
        run(py, || self.inner.check_invariants())
    }

    /// Benchmark helper: times `iters` drafts (round-robin over `rids`) inside Rust, without
    /// the GIL. Returns wall-clock and thread-CPU nanoseconds per draft and the mean draft
    /// size (CPU time leaves out time the thread was preempted on a busy machine).
    #[allow(clippy::type_complexity)]
    fn _time_drafts<'py>(
        &self,
        py: Python<'py>,
        rids: Vec<Bound<'py, PyAny>>,
        budget: usize,
        multi_branch: bool,
        iters: usize,
    ) -> PyResult<(Bound<'py, PyArray1<u64>>, Bound<'py, PyArray1<u64>>, f64)> {
        let ids = rids.iter().map(args::rid).collect::<PyResult<Vec<_>>>()?;
        if ids.is_empty() {
            return Err(to_pyerr(py, Error::InvalidInput("rids is empty".into())));
        }
        if iters > MAX_TIMED_DRAFTS {
            return Err(to_pyerr(
                py,
                Error::InvalidInput(format!("iters must be <= {MAX_TIMED_DRAFTS}, got {iters}")),
            ));
        }
        let (wall, cpu, nodes) = run(py, || {
            let mut wall = Vec::with_capacity(iters);
            let mut cpu = Vec::with_capacity(iters);
            let mut nodes = 0usize;
            for i in 0..iters {
                let c0 = thread_cpu_ns();
                let t0 = Instant::now();
                let d = self
                    .inner
                    .draft(&ids[i % ids.len()], budget, multi_branch)?;
                wall.push(t0.elapsed().as_nanos() as u64);
                cpu.push(thread_cpu_ns().saturating_sub(c0));
                nodes += d.num_nodes() - 1;
            }
            Ok((wall, cpu, nodes as f64 / iters.max(1) as f64))
        })?;
        Ok((
            PyArray1::from_vec(py, wall),
            PyArray1::from_vec(py, cpu),
            nodes,
        ))
    }

    /// Benchmark helper (`Cache::time_compaction_stall`): compacts `namespace`'s shrunk
    /// history on a second thread (`mode`: "beside", "in place", or "none") while this one
    /// steps `rids` one token at a time, without the GIL. Returns (compaction ns, slots before, live nodes, wall ns of each step that
    /// overlapped it).
    #[allow(clippy::type_complexity)]
    #[pyo3(signature = (namespace, rids, tokens, budget, mode="beside"))]
    fn _time_compaction_stall<'py>(
        &self,
        py: Python<'py>,
        namespace: String,
        rids: Vec<Bound<'py, PyAny>>,
        tokens: Vec<u32>,
        budget: usize,
        mode: &str,
    ) -> PyResult<(u64, u64, u64, Bound<'py, PyArray1<u64>>)> {
        let ids = rids.iter().map(args::rid).collect::<PyResult<Vec<_>>>()?;
        let r = run(py, || {
            self.inner
                .time_compaction_stall(&namespace, &ids, &tokens, budget, mode)
        })?;
        Ok((
            r.compaction_ns,
            r.slots,
            r.live,
            PyArray1::from_vec(py, r.steps_ns),
        ))
    }
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Benchmark helper: builds a standalone own trie of `tokens` at `max_depth` and returns
/// (nanoseconds, nodes, bytes).
#[pyfunction]
pub fn _time_index(
    py: Python<'_>,
    tokens: PyReadonlyArray1<'_, u32>,
    max_depth: usize,
) -> PyResult<(u64, u64, u64)> {
    let text = tokens.as_array().to_vec();
    run(py, || {
        let t0 = Instant::now();
        let t = Trie::from_windows(&text, max_depth);
        let ns = t0.elapsed().as_nanos() as u64;
        Ok((ns, t.nodes(), t.bytes() as u64))
    })
}

/// Benchmark helper: counts every window of `tokens` at `max_depth` into a history trie
/// (suffix links as a history keeps them), evicts until its free slots reach its live nodes
/// (what triggers a compaction in the cache), then times `Trie::compact`. Returns
/// (nanoseconds, slots before, live nodes).
#[pyfunction]
pub fn _time_compaction(
    py: Python<'_>,
    tokens: PyReadonlyArray1<'_, u32>,
    max_depth: usize,
) -> PyResult<(u64, u64, u64)> {
    let text = tokens.as_array().to_vec();
    run(py, || {
        let mut t = Trie::new();
        t.allowance = u64::MAX;
        t.add_windows(&text, max_depth, 0..text.len());
        t.allowance = 0;
        t.compute_links();
        while t.free_slots() < t.nodes() {
            t.sweep(1 << 20, u64::MAX);
        }
        let (slots, live) = (u64::from(t.arena.slots()), t.nodes());
        let t0 = Instant::now();
        t.compact();
        Ok((t0.elapsed().as_nanos() as u64, slots, live))
    })
}

/// Panics inside the core (for the test that a panic becomes an exception).
#[pyfunction]
pub fn _panic_for_test(py: Python<'_>) -> PyResult<()> {
    run(py, || -> Result<()> { panic!("deliberate test panic") })
}
