//! The shared node budget and the CLOCK eviction sweep over shared-history tries.
//!
//! Every non-root node of every trie is paid for from one `Budget` before it is created, so
//! `nodes <= capacity` holds after any sequence of operations, concurrent ones included.
//! Eviction is a CLOCK sweep over a history trie's arena: a visited node with count 0 and no
//! children is freed, any other node has its count halved. Frequent n-grams therefore survive
//! several revolutions, rare and stale ones go first; parents become leaves (and evictable)
//! only after their children went. Own tries of live requests are never swept.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::arena::NONE;
use crate::trie::{Trie, ROOT};

/// Nodes that may exist, all tries together (roots excluded).
pub struct Budget {
    capacity: u64,
    used: AtomicU64,
    /// Nodes the live requests' own tries hold for their outputs' n-grams (part of `used`).
    own_outputs: AtomicU64,
}

impl Budget {
    pub fn new(capacity: u64) -> Self {
        Budget {
            capacity,
            used: AtomicU64::new(0),
            own_outputs: AtomicU64::new(0),
        }
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Nodes reserved now (stored plus reserved-but-unused).
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    /// Reserves up to `n` nodes; returns how many were granted.
    pub fn reserve_up_to(&self, n: u64) -> u64 {
        let mut cur = self.used.load(Ordering::Relaxed);
        loop {
            let g = n.min(self.capacity.saturating_sub(cur));
            if g == 0 {
                return 0;
            }
            match self
                .used
                .compare_exchange_weak(cur, cur + g, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return g,
                Err(now) => cur = now,
            }
        }
    }

    pub fn release(&self, n: u64) {
        if n > 0 {
            let prev = self.used.fetch_sub(n, Ordering::AcqRel);
            debug_assert!(prev >= n, "budget released more than reserved");
        }
    }

    /// Nodes live requests' own tries hold for their outputs.
    pub fn own_outputs(&self) -> u64 {
        self.own_outputs.load(Ordering::Relaxed)
    }

    /// Whether live requests may count more outputs into their own tries: those nodes are
    /// never evicted while the request lives, so they may hold at most half the capacity
    /// (the rest stays for prompts and the evictable shared history).
    pub fn own_outputs_fit(&self) -> bool {
        self.own_outputs.load(Ordering::Relaxed) < self.capacity / 2
    }

    /// Records `added` (positive) or freed (negative) own-trie output nodes.
    pub fn note_own_outputs(&self, delta: i64) {
        if delta >= 0 {
            self.own_outputs.fetch_add(delta as u64, Ordering::Relaxed);
        } else {
            self.own_outputs
                .fetch_sub(delta.unsigned_abs(), Ordering::Relaxed);
        }
    }
}

impl Trie {
    /// Advances the CLOCK hand over at most `visits` slots; stops early once `want` nodes are
    /// freed. Returns the nodes freed (the caller returns them to the budget).
    pub fn sweep(&mut self, visits: u32, want: u64) -> u64 {
        let mut freed = 0;
        let slots = self.arena.slots();
        if slots <= 1 {
            return 0;
        }
        for _ in 0..visits {
            if self.hand >= slots || self.hand == ROOT {
                self.hand = 1;
            }
            let i = self.hand;
            self.hand += 1;
            let n = self.node(i);
            if n.is_free() {
                continue;
            }
            // A link target goes after the longer n-grams that link to it.
            if n.count == 0 && n.first_child == NONE && n.linked_by == 0 {
                self.free_leaf(i);
                freed += 1;
                if freed >= want {
                    break;
                }
            } else {
                self.decay(i);
            }
        }
        freed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_never_exceeds_capacity() {
        let b = Budget::new(10);
        assert_eq!(b.reserve_up_to(7), 7);
        assert_eq!(b.reserve_up_to(7), 3);
        assert_eq!(b.reserve_up_to(1), 0);
        b.release(5);
        assert_eq!(b.used(), 5);
    }

    #[test]
    fn sweep_frees_rare_before_frequent() {
        let mut t = Trie::new();
        t.allowance = u64::MAX;
        for _ in 0..8 {
            t.add_window(&[1, 2]);
        }
        t.add_window(&[3, 4]);
        // The rare n-gram "3 4" (count 1) goes before "1 2" (count 8) loses anything.
        let mut freed = 0;
        while t.walk(&[3]) != NONE {
            freed += t.sweep(1, u64::MAX);
            t.check().unwrap();
        }
        assert_eq!(freed, 2);
        assert_ne!(t.walk(&[1, 2]), NONE);
        // Sweeping long enough empties the trie.
        while t.nodes() > 0 {
            t.sweep(100, u64::MAX);
        }
        t.check().unwrap();
    }
}
