//! Node storage: a segmented arena addressed by `u32` indices, with a free list.
//!
//! Segments have a fixed size and are never reallocated, so growing the arena never copies
//! existing nodes (a writer holding a lock never stalls readers behind a multi-MB memcpy).

use std::sync::Mutex;

/// Index of "no node" (absent parent, child, sibling, side table).
pub const NONE: u32 = u32::MAX;
/// `parent` value of a slot on the free list.
pub const FREED: u32 = u32::MAX - 1;

const SEG_BITS: u32 = 16;
const SEG_LEN: usize = 1 << SEG_BITS;
const SEG_MASK: u32 = (SEG_LEN as u32) - 1;
/// Slots the first segment starts with.
const FIRST_SEG_LEN: usize = 16;

/// One trie node: 36 bytes. Children form a doubly linked sibling list (O(1) unlink on
/// eviction); a node with many children also gets a hash side table (`side`) for lookup.
/// History tries also keep suffix links (`link`: the node of this n-gram minus its first
/// token), so a long copy is followed without walking from the root at every step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Node {
    pub token: u32,
    /// Occurrences of this n-gram in the indexed text (decayed by eviction sweeps).
    pub count: u32,
    pub parent: u32,
    pub first_child: u32,
    pub next_sibling: u32,
    pub prev_sibling: u32,
    /// Index into the trie's side tables, or `NONE`.
    pub side: u32,
    /// Suffix link, or `NONE` where unknown.
    pub link: u32,
    /// Nodes whose suffix link points here (such a node is never evicted).
    pub linked_by: u32,
}

impl Node {
    pub const fn new(token: u32, parent: u32) -> Self {
        Node {
            token,
            count: 0,
            parent,
            first_child: NONE,
            next_sibling: NONE,
            prev_sibling: NONE,
            side: NONE,
            link: NONE,
            linked_by: 0,
        }
    }

    pub fn is_free(&self) -> bool {
        self.parent == FREED
    }
}

/// Full-size segments of dropped arenas, reused by new ones: a request's own trie then
/// lands in memory that is already mapped (page faults cost more than building, in a VM).
static SPARE: Mutex<Vec<Vec<Node>>> = Mutex::new(Vec::new());
/// Most spare segments kept (x 1.8 MB); memory beyond this goes back to the allocator.
const MAX_SPARE: usize = 16;

fn fresh_segment() -> Vec<Node> {
    let spare = SPARE.lock().ok().and_then(|mut v| v.pop());
    spare.unwrap_or_else(|| Vec::with_capacity(SEG_LEN))
}

/// Fixed-size segments of nodes plus a free list threaded through `next_sibling`.
#[derive(Default)]
pub struct Arena {
    segs: Vec<Vec<Node>>,
    slots: u32,
    free_head: u32,
    free_len: u32,
}

impl Arena {
    pub fn new() -> Self {
        Arena {
            segs: Vec::new(),
            slots: 0,
            free_head: NONE,
            free_len: 0,
        }
    }

    /// An arena expecting about `n` nodes (plus the root): a small one allocates just that,
    /// a big one starts with a full-size segment (reused memory, when a spare one exists).
    pub fn with_hint(n: u64) -> Self {
        let mut a = Arena::new();
        let want = n.saturating_add(1);
        if want >= SEG_LEN as u64 / 2 {
            a.segs.push(fresh_segment());
        } else {
            a.segs
                .push(Vec::with_capacity((want as usize).max(FIRST_SEG_LEN)));
        }
        a
    }

    /// Slots ever handed out (live + free); valid indices are `0..slots()`.
    pub fn slots(&self) -> u32 {
        self.slots
    }

    /// Live nodes.
    pub fn live(&self) -> u32 {
        self.slots - self.free_len
    }

    pub fn free_len(&self) -> u32 {
        self.free_len
    }

    /// Bytes of the node storage: every segment's whole allocation (written or not), so
    /// a memory bound checked against it holds for what the allocator really handed out.
    pub fn bytes(&self) -> usize {
        let segs: usize = self.segs.iter().map(Vec::capacity).sum();
        segs * std::mem::size_of::<Node>() + self.segs.capacity() * std::mem::size_of::<Vec<Node>>()
    }

    #[inline]
    pub fn get(&self, i: u32) -> &Node {
        &self.segs[(i >> SEG_BITS) as usize][(i & SEG_MASK) as usize]
    }

    #[inline]
    pub fn get_mut(&mut self, i: u32) -> &mut Node {
        &mut self.segs[(i >> SEG_BITS) as usize][(i & SEG_MASK) as usize]
    }

    /// Asks the CPU to start loading slot `i` (no-op for `NONE` or elsewhere than x86-64):
    /// walks over many requests' tries wait on memory, and independent loads can overlap.
    #[inline]
    pub fn prefetch(&self, i: u32) {
        #[cfg(target_arch = "x86_64")]
        if i < self.slots {
            let p: *const Node = self.get(i);
            // SAFETY: a prefetch has no architectural effect; `p` points into a live segment.
            #[allow(unused_unsafe)]
            unsafe {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
                _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>());
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = i;
    }

    /// Stores `node` in a free slot (reused first) and returns its index.
    pub fn alloc(&mut self, node: Node) -> u32 {
        if self.free_head != NONE {
            let i = self.free_head;
            self.free_head = self.get(i).next_sibling;
            self.free_len -= 1;
            *self.get_mut(i) = node;
            return i;
        }
        assert!(self.slots < FREED, "arena index space exhausted");
        let seg = (self.slots >> SEG_BITS) as usize;
        if seg == self.segs.len() {
            // Small first segment: most own tries of short requests, and the histories of
            // most namespaces of a many-tenant server, stay tiny.
            self.segs.push(if seg == 0 {
                Vec::with_capacity(FIRST_SEG_LEN)
            } else {
                fresh_segment()
            });
        }
        let s = &mut self.segs[seg];
        if s.len() == s.capacity() {
            // The first segment doubles (copying at most half a segment, once per size);
            // later ones are full-size from the start.
            // (`max` then `min`, not `clamp`: within 16 slots of a full segment the lower
            // bound would exceed the upper one.)
            s.reserve_exact(s.capacity().max(FIRST_SEG_LEN).min(SEG_LEN - s.len()));
        }
        s.push(node);
        let i = self.slots;
        self.slots += 1;
        i
    }

    /// Returns slot `i` to the free list. The caller has unlinked it.
    pub fn free(&mut self, i: u32) {
        let head = self.free_head;
        let n = self.get_mut(i);
        *n = Node::new(0, FREED);
        n.next_sibling = head;
        self.free_head = i;
        self.free_len += 1;
    }

    /// Indices on the free list (for invariant checks).
    pub fn free_list(&self) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.free_len as usize);
        let mut i = self.free_head;
        while i != NONE && out.len() <= self.free_len as usize {
            out.push(i);
            i = self.get(i).next_sibling;
        }
        out
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        if let Ok(mut spare) = SPARE.lock() {
            for mut seg in self.segs.drain(..) {
                if spare.len() >= MAX_SPARE {
                    break;
                }
                if seg.capacity() == SEG_LEN {
                    seg.clear();
                    spare.push(seg);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_is_36_bytes() {
        assert_eq!(std::mem::size_of::<Node>(), 36);
    }

    #[test]
    fn a_first_segment_of_any_size_grows_to_a_full_one() {
        // Capacities that double to within 16 slots of a full segment once made the growth
        // step panic (clamp with min > max).
        for n in [
            0u64, 14, 15, 16, 1000, 8190, 16380, 16381, 16382, 32760, 32766, 32767,
        ] {
            let mut a = Arena::with_hint(n);
            for t in 0..(SEG_LEN as u32 + 10) {
                a.alloc(Node::new(t, NONE));
            }
            assert_eq!(a.live(), SEG_LEN as u32 + 10);
            assert_eq!(a.segs[0].capacity(), SEG_LEN, "hint {n}");
        }
    }

    #[test]
    fn alloc_free_reuse_across_segments() {
        let mut a = Arena::new();
        let n = (SEG_LEN + 5000) as u32;
        for t in 0..n {
            assert_eq!(a.alloc(Node::new(t, NONE)), t);
        }
        assert_eq!(a.get(SEG_LEN as u32 + 3).token, SEG_LEN as u32 + 3);
        a.free(5);
        a.free(70_000);
        assert_eq!(a.live(), n - 2);
        assert_eq!(a.free_list(), vec![70_000, 5]);
        assert_eq!(a.alloc(Node::new(1, NONE)), 70_000);
        assert_eq!(a.alloc(Node::new(2, NONE)), 5);
        assert_eq!(a.alloc(Node::new(3, NONE)), n);
        assert_eq!(a.live(), n + 1);
    }
}
