//! lookahead-core: an arena trie of n-grams for lossless speculative decoding (Lookahead).
//!
//! See rust/README.md for the design: node layout, eviction order, scoring, concurrency.

pub mod arena;
pub mod cache;
pub mod calibration;
pub mod draft;
pub mod error;
pub mod evict;
pub mod learned_costs;
pub mod persist;
mod pool;
pub mod recycle;
pub mod sizing;
pub mod trie;

#[cfg(feature = "python")]
mod py;

pub use cache::{Cache, Config, RequestId, Stats};
pub use draft::DraftTree;
pub use error::{Error, Result};
