//! The cache: requests, namespaces, prompt indexing, output streaming, drafting, eviction.
//!
//! - `config`: the knobs, their defaults and limits
//! - `locks`: the lock helpers, and the order locks are taken in
//! - `namespace`: one tenant's shared history, and a use of it
//! - `request`: a live request: its own trie (built from its prompt), its cursors
//! - `corpus`: operator-given corpora, built aside, published whole, removed by id
//! - `shared`: the state background jobs share, and eviction across namespaces
//! - `indexing`: counting n-grams into a trie; prompt builds
//! - `api`: `Cache`, the operations a serving loop calls
//! - `inspect`: statistics, invariant checks, and what tests and saves read
//!
//! Concurrency: each namespace's shared history is one `Trie` behind an `RwLock`. Writers
//! (`extend`, `add_history`, prompt merges, eviction sweeps) hold the write lock for bounded
//! chunks only (`CHUNK_TOKENS` tokens or `SWEEP_VISITS` slots), so a draft never waits long.
//! A request's own trie is built from its prompt once (in the background by default), then
//! grows with that request's outputs; only that request's own calls wait for it or lock it.
//! The order locks are taken in is in `locks`.

mod api;
mod config;
mod corpus;
#[cfg(test)]
mod corpus_tests;
mod indexing;
mod inspect;
mod locks;
mod namespace;
mod request;
mod shared;
#[cfg(test)]
mod tests;

pub use api::{Cache, Stats};
pub use config::*;
#[cfg(test)]
use corpus::building;
pub use corpus::{Corpus, CorpusBuild, CorpusInfo, CORPUS_SHARE, MAX_CORPORA, MAX_CORPUS_ID_BYTES};
pub use inspect::CompactionStall;
pub use locks::panic_message;
pub use namespace::Namespace;
pub use request::{OwnTrie, RequestId};
