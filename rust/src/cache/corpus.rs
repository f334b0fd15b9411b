//! Corpora: text an operator hands the cache (a product manual, a code base, yesterday's
//! answers) that drafts read beside each request's own text and its namespace's history.
//!
//! A corpus is one trie, built off to the side (`CorpusBuild`) and published whole once
//! built, then never written again: drafts read it without a lock, and removing it by its
//! id drops it whole (its nodes go back to the budget then; a draft still reading it keeps
//! its memory until that draft ends, microseconds).
//! Corpora are never evicted: they are what the operator asked for. Together they hold at
//! most `1 / CORPUS_SHARE` of the capacity; a corpus that would go past it, or past what
//! evicting shared history can free, is cut there and says so (`CorpusInfo::cut`).
//!
//! A corpus serves every namespace (`scope` None) or one (`scope` Some(name)). Drafts from
//! it are mixed with the request's draft by `draft::mix` at `Config::corpus_weight`.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::trie::Trie;

use super::api::Cache;
use super::config::CHUNK_TOKENS;
use super::indexing::count_ngrams;
use super::locks::{read, write};
use super::namespace::check_namespace;
use super::request::Cursors;
use super::shared::{Busy, Shared};

/// Corpora together hold at most `capacity_nodes / CORPUS_SHARE` nodes: the rest stays for
/// prompts and the shared histories, which a corpus never evicts below that.
pub const CORPUS_SHARE: u64 = 2;

/// Most corpora a cache holds at once (each costs a draft per request step).
pub const MAX_CORPORA: usize = 64;

/// Longest corpus id, in bytes.
pub const MAX_CORPUS_ID_BYTES: usize = 1024;

/// A published corpus: immutable.
pub struct Corpus {
    pub id: String,
    /// The namespace it serves; `None`: every namespace.
    pub scope: Option<String>,
    /// Tokens indexed (all documents, up to the cut if it was cut).
    pub tokens: u64,
    /// Whether it was cut short by the capacity.
    pub cut: bool,
    pub trie: Trie,
}

impl Corpus {
    pub(crate) fn new(
        id: String,
        scope: Option<String>,
        tokens: u64,
        cut: bool,
        trie: Trie,
    ) -> Self {
        Corpus {
            id,
            scope,
            tokens,
            cut,
            trie,
        }
    }

    /// Whether drafts of namespace `ns` read it.
    pub fn serves(&self, ns: &str) -> bool {
        self.scope.as_deref().is_none_or(|s| s == ns)
    }

    pub fn info(&self) -> CorpusInfo {
        CorpusInfo {
            id: self.id.clone(),
            scope: self.scope.clone(),
            tokens: self.tokens,
            nodes: self.trie.nodes(),
            bytes: self.trie.bytes() as u64,
            cut: self.cut,
        }
    }
}

/// What `Cache::corpora` and `Cache::commit_corpus` report of a corpus.
#[derive(Clone, Debug, PartialEq)]
pub struct CorpusInfo {
    pub id: String,
    pub scope: Option<String>,
    pub tokens: u64,
    pub nodes: u64,
    pub bytes: u64,
    pub cut: bool,
}

/// A corpus being built: its trie, not yet visible to drafts. Dropped unpublished (an
/// error, Ctrl-C), its nodes go back to the budget. One build at a time per cache.
pub struct CorpusBuild {
    shared: Arc<Shared>,
    id: String,
    scope: Option<String>,
    trie: Trie,
    cur: Cursors,
    tokens: u64,
    cut: bool,
    /// Nodes this build may still take under the corpora's share.
    share_left: u64,
}

impl Drop for CorpusBuild {
    fn drop(&mut self) {
        let t = std::mem::take(&mut self.trie);
        self.shared.budget.release(t.nodes() + t.allowance);
        self.shared.building_corpus.store(false, Ordering::Release);
        self.shared.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.shared.op_seq.fetch_add(1, Ordering::AcqRel);
    }
}

pub(crate) fn check_corpus_id(id: &str) -> Result<()> {
    if id.is_empty() || id.len() > MAX_CORPUS_ID_BYTES {
        return Err(Error::InvalidInput(format!(
            "a corpus id must be 1 to {MAX_CORPUS_ID_BYTES} bytes, got {} bytes",
            id.len()
        )));
    }
    Ok(())
}

impl CorpusBuild {
    /// Counts the n-grams of document `text` that end at a token in `part` (parts given in
    /// order tile a document; a document's first part starts at 0). Stops, and marks the
    /// build cut, where the corpora's share or the capacity runs out; later calls then do
    /// nothing. Returns whether the build is still taking text.
    pub fn add_part(&mut self, text: &[u32], part: std::ops::Range<usize>) -> Result<bool> {
        if part.start > part.end || part.end > text.len() {
            return Err(Error::InvalidInput(format!(
                "part {part:?} of a document of {} tokens",
                text.len()
            )));
        }
        let depth = self.shared.cfg.max_depth;
        if part.start == 0 {
            self.cur = Cursors::stale(); // a new document: no n-gram crosses into it
        }
        let mut s = part.start;
        while s < part.end && !self.cut {
            let end = (s + CHUNK_TOKENS).min(part.end);
            let need = ((end - s) * depth + depth * depth) as u64;
            let want = need.min(self.share_left);
            let mut got = self.shared.budget.reserve_up_to(want);
            if got < want {
                // Room from the shared histories (never from another corpus or a prompt).
                self.shared.make_room(want - got, None);
                got += self.shared.budget.reserve_up_to(want - got);
            }
            self.trie.allowance = got;
            let before = &text[s.saturating_sub(depth - 1)..s];
            count_ngrams(&mut self.trie, &mut self.cur, before, &text[s..end], depth);
            let unused = std::mem::take(&mut self.trie.allowance);
            self.shared.budget.release(unused);
            self.share_left -= got - unused;
            if unused == 0 && got < need {
                // The allowance ran out: some n-grams of this chunk were not stored.
                self.cut = true;
                break;
            }
            self.tokens += (end - s) as u64;
            s = end;
        }
        Ok(!self.cut)
    }
}

impl Cache {
    /// Starts building corpus `id` (serving namespace `scope`, or every namespace). Fails
    /// if a corpus of that id exists, `MAX_CORPORA` do, or another build is in progress.
    pub fn begin_corpus(&self, id: &str, scope: Option<&str>) -> Result<CorpusBuild> {
        check_corpus_id(id)?;
        if let Some(s) = scope {
            check_namespace(s)?;
        }
        self.check_new_corpus(id)?;
        if self.shared.building_corpus.swap(true, Ordering::AcqRel) {
            return Err(Error::InvalidInput(
                "another corpus is being loaded; load one at a time".into(),
            ));
        }
        self.shared.in_flight.fetch_add(1, Ordering::AcqRel);
        let held: u64 = read(&self.shared.corpora)
            .iter()
            .map(|c| c.trie.nodes())
            .sum();
        let share = self.shared.budget.capacity() / CORPUS_SHARE;
        Ok(CorpusBuild {
            shared: Arc::clone(&self.shared),
            id: id.to_owned(),
            scope: scope.map(str::to_owned),
            trie: Trie::new(),
            cur: Cursors::stale(),
            tokens: 0,
            cut: false,
            share_left: share.saturating_sub(held),
        })
    }

    fn check_new_corpus(&self, id: &str) -> Result<()> {
        let all = read(&self.shared.corpora);
        if all.iter().any(|c| c.id == id) {
            return Err(Error::InvalidInput(format!(
                "corpus {id:?} exists; remove it before loading another under that id"
            )));
        }
        if all.len() >= MAX_CORPORA {
            return Err(Error::InvalidInput(format!(
                "{MAX_CORPORA} corpora are loaded, the most a cache holds; remove one first"
            )));
        }
        Ok(())
    }

    /// Publishes a build: drafts read it from the next draft on.
    pub fn commit_corpus(&self, mut build: CorpusBuild) -> Result<CorpusInfo> {
        let _busy = Busy::new(&self.shared);
        self.check_new_corpus(&build.id)?;
        let trie = std::mem::take(&mut build.trie);
        let corpus = Arc::new(Corpus::new(
            std::mem::take(&mut build.id),
            build.scope.take(),
            build.tokens,
            build.cut,
            trie,
        ));
        let info = corpus.info();
        self.install_corpus(corpus);
        drop(build); // its trie is empty now: nothing released twice
        Ok(info)
    }

    /// Adds a published corpus (a build, or a loaded file's).
    pub(crate) fn install_corpus(&self, corpus: Arc<Corpus>) {
        let mut all = write(&self.shared.corpora);
        all.push(corpus);
        self.shared.corpus_count.store(all.len(), Ordering::Release);
    }

    /// Removes corpus `id`; returns whether it existed. Drafts in progress finish with it;
    /// its nodes go back to the budget when the last of them does.
    pub fn remove_corpus(&self, id: &str) -> bool {
        let _busy = Busy::new(&self.shared);
        let mut all = write(&self.shared.corpora);
        let Some(i) = all.iter().position(|c| c.id == id) else {
            return false;
        };
        let gone = all.remove(i);
        self.shared.corpus_count.store(all.len(), Ordering::Release);
        drop(all);
        self.shared.budget.release(gone.trie.nodes());
        true
    }

    /// Moves every corpus into `to` (a cache of the same configuration, say one replacing
    /// this one on a reset), within its capacity: a corpus that does not fit stays here.
    /// Returns the ids moved.
    pub fn move_corpora_to(&self, to: &Cache) -> Vec<String> {
        let _busy = Busy::new(&self.shared);
        let _busy_to = Busy::new(&to.shared);
        let mut moved = Vec::new();
        let mut all = write(&self.shared.corpora);
        let mut kept = Vec::new();
        for c in all.drain(..) {
            let n = c.trie.nodes();
            let got = to.shared.budget.reserve_up_to(n);
            if got < n || read(&to.shared.corpora).len() >= MAX_CORPORA {
                to.shared.budget.release(got);
                kept.push(c);
                continue;
            }
            self.shared.budget.release(n);
            moved.push(c.id.clone());
            to.install_corpus(c);
        }
        *all = kept;
        self.shared.corpus_count.store(all.len(), Ordering::Release);
        moved
    }

    /// The corpora, in the order they were added.
    pub fn corpora(&self) -> Vec<CorpusInfo> {
        read(&self.shared.corpora)
            .iter()
            .map(|c| c.info())
            .collect()
    }

    /// The corpora that drafts of namespace `ns` read (none without a lock when there are
    /// no corpora at all).
    pub(super) fn corpora_serving(&self, ns: &str) -> Vec<Arc<Corpus>> {
        if self.shared.corpus_count.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        read(&self.shared.corpora)
            .iter()
            .filter(|c| c.serves(ns))
            .cloned()
            .collect()
    }

    /// Every corpus, for persistence.
    pub(crate) fn corpora_arcs(&self) -> Vec<Arc<Corpus>> {
        read(&self.shared.corpora).clone()
    }
}

/// Whether a cache has a corpus build in progress (tests).
#[cfg(test)]
pub(crate) fn building(cache: &Cache) -> bool {
    cache.shared.building_corpus.load(Ordering::Acquire)
}
