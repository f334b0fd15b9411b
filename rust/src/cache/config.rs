//! The cache's knobs (`Config`), their defaults and the limits they are checked against.

use crate::error::{Error, Result};
use crate::recycle::MAX_WIDTH;

/// Tokens of one write-lock hold in `extend` / `add_history` / prompt merges.
pub const CHUNK_TOKENS: usize = 64;

/// Slots one eviction step visits per write-lock hold.
pub const SWEEP_VISITS: u32 = 4096;

/// Largest `max_depth` accepted.
pub const MAX_DEPTH: usize = 64;

/// Largest `capacity_nodes` accepted (node indices are u32, two of them reserved).
pub const MAX_CAPACITY_NODES: u64 = u32::MAX as u64 - 2;
/// Largest draft budget accepted.
pub const MAX_BUDGET: usize = 1 << 16;

/// Most background indexing threads: more only compete for the cores and the capacity.
pub const MAX_INDEX_THREADS: usize = 256;

/// Largest `own_weight` / `history_weight`: scores stay finite (`weight * count` and the
/// two weights' sum) for any count.
pub const MAX_WEIGHT: f64 = 1e6;

/// Longest namespace name, in bytes (what a save file can hold).
pub const MAX_NAMESPACE_BYTES: usize = 1 << 20;

/// A namespace holding more than `1 / NAMESPACE_SHARE` of the capacity makes room for its
/// own writes by evicting its own history first: one noisy tenant leaves the others at
/// least half of the capacity.
pub const NAMESPACE_SHARE: u64 = 2;

/// One request's own trie takes at most `1 / PROMPT_SHARE` of the capacity (a longer
/// prompt is indexed up to there): one huge prompt cannot evict every tenant's history.
pub const PROMPT_SHARE: u64 = 4;

/// Bytes one capacity node costs at worst (whole arena segments, free slots awaiting
/// compaction, side tables): the bound `tests/test_cache_memory.py` checks after every
/// operation of any stream. About 62 are typical.
pub const WORST_BYTES_PER_NODE: u64 = 256;

/// Bytes one namespace or live request costs at worst besides its nodes (its bookkeeping
/// and its first arena segment).
pub const WORST_BYTES_PER_HOLDER: u64 = 8 << 10;

/// Under `capacity_bytes`, namespaces' own bookkeeping gets `1 / HOLDER_SHARE` of the bytes
/// (so at most that many bytes' worth of namespaces exist), the nodes the rest.
pub const HOLDER_SHARE: u64 = 8;

/// Smallest `capacity_bytes` accepted (0 = no byte budget).
pub const MIN_CAPACITY_BYTES: u64 = 1 << 20;

/// The default `history_skip`: a 3-6 token match in the shared history is left out of the
/// draft (simulator, B = 16: 2.772 -> 2.794 tokens per step, no category down; repeated
/// requests still copy their whole earlier answer; research/README.md).
pub const DEFAULT_HISTORY_SKIP: Option<(usize, usize)> = Some((3, 6));

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub max_depth: usize,
    pub capacity_nodes: u64,
    pub own_weight: f64,
    pub history_weight: f64,
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
    /// Weight of a corpus's draft against the request's own draft (from its own text and its
    /// namespace's history, taken together) where both answer (see `draft::mix`).
    pub corpus_weight: f64,
    /// A bound on the cache's bytes, all namespaces together (0: none; `capacity_nodes`
    /// alone bounds it): the node capacity and the namespaces are cut to what fits at the
    /// worst case per node and per namespace (`node_capacity`, `max_namespaces`).
    pub capacity_bytes: u64,
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
            own_weight: 4.0,
            history_weight: 1.0,
            keep_prompt_as_history: false,
            background_indexing: true,
            index_threads: 0,
            history_skip: DEFAULT_HISTORY_SKIP,
            recycle_k: 0,
            recycle_slots: DEFAULT_RECYCLE_SLOTS,
            recycle_weight: 0.5,
            corpus_weight: 1.0,
            capacity_bytes: 0,
        }
    }
}

impl Config {
    /// Whether recycled predictions are kept (and drafts read them).
    pub fn recycles(&self) -> bool {
        self.recycle_k > 0 && self.recycle_slots > 0
    }

    /// Bytes the recycled-prediction table holds at most, once full: per slot its row
    /// (`8 * recycle_k`), its owner (24) and, at worst, 2 x 8/7 hash-table buckets of 25
    /// bytes (a power of two just past 7/8 full, doubled once by tombstones), about 58.
    pub fn recycle_bytes_max(&self) -> u64 {
        if self.recycles() {
            self.recycle_slots as u64 * (8 * self.recycle_k as u64 + 82)
        } else {
            0
        }
    }

    /// Bytes of `capacity_bytes` left for trie nodes (after namespaces' bookkeeping and the
    /// recycled predictions), if a byte budget is set.
    fn node_bytes(&self) -> Option<u64> {
        (self.capacity_bytes > 0).then(|| {
            (self.capacity_bytes - self.capacity_bytes / HOLDER_SHARE)
                .saturating_sub(self.recycle_bytes_max())
        })
    }

    /// The nodes the budget holds: `capacity_nodes`, and under `capacity_bytes` at most
    /// what its node share fits at `WORST_BYTES_PER_NODE`.
    pub fn node_capacity(&self) -> u64 {
        match self.node_bytes() {
            Some(b) => (b / WORST_BYTES_PER_NODE).clamp(1, self.capacity_nodes),
            None => self.capacity_nodes,
        }
    }

    /// Under `capacity_bytes`, the most namespaces kept at once (beyond it, unused ones go
    /// whole, least recently queued first).
    pub fn max_namespaces(&self) -> Option<usize> {
        (self.capacity_bytes > 0)
            .then(|| (self.capacity_bytes / HOLDER_SHARE / WORST_BYTES_PER_HOLDER).max(1) as usize)
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidInput(m));
        if !(2..=MAX_DEPTH).contains(&self.max_depth) {
            return bad(format!(
                "max_depth must be in 2..={MAX_DEPTH}, got {}",
                self.max_depth
            ));
        }
        if !(1..=MAX_CAPACITY_NODES).contains(&self.capacity_nodes) {
            return bad(format!(
                "capacity_nodes must be in 1..2**32-2, got {}",
                self.capacity_nodes
            ));
        }
        if self.capacity_bytes != 0 && self.capacity_bytes < MIN_CAPACITY_BYTES {
            return bad(format!(
                "capacity_bytes must be 0 (none) or at least {MIN_CAPACITY_BYTES}, got {}",
                self.capacity_bytes
            ));
        }
        if let Some(b) = self.node_bytes() {
            if b < MIN_CAPACITY_BYTES / 2 {
                return bad(format!(
                    "capacity_bytes {} leaves {b} bytes for trie nodes once recycled \
                     predictions (up to {} bytes: recycle_slots x (8 x recycle_k + 82)) and \
                     namespaces (1/{HOLDER_SHARE}) have theirs; at least {} are needed",
                    self.capacity_bytes,
                    self.recycle_bytes_max(),
                    MIN_CAPACITY_BYTES / 2
                ));
            }
        }
        if self.index_threads > MAX_INDEX_THREADS {
            return bad(format!(
                "index_threads must be in 0..={MAX_INDEX_THREADS}, got {}",
                self.index_threads
            ));
        }
        for (name, w) in [
            ("own_weight", self.own_weight),
            ("history_weight", self.history_weight),
        ] {
            if !(0.0..=MAX_WEIGHT).contains(&w) {
                return bad(format!("{name} must be in [0, {MAX_WEIGHT:e}], got {w}"));
            }
        }
        if self.own_weight + self.history_weight <= 0.0 {
            return bad("own_weight and history_weight cannot both be 0".into());
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
        if !(self.corpus_weight > 0.0 && self.corpus_weight <= MAX_WEIGHT) {
            return bad(format!(
                "corpus_weight must be in (0, {MAX_WEIGHT:e}], got {}",
                self.corpus_weight
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
