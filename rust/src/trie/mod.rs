//! One n-gram trie: window insertion, child lookup, leaf removal and invariant checks.
//!
//! - this file: the trie, child lookup and counting, links, leaf removal
//! - `side`: side tables, each hub's children ranked by count
//! - `build`: indexing windows, one by one or a whole prompt at once
//! - `check`: invariant checks, compaction, and the n-gram listing tests compare
//!
//! A node stands for the n-gram spelled by the path from the root; its `count` is the number
//! of indexed occurrences of that n-gram. Small fan-out is a sibling list scan; above
//! `SIDE_AT` children a node gets a hash side table (token -> child), so the root and other
//! hot nodes look up in O(1).

mod build;
mod check;
mod side;
#[cfg(test)]
mod tests;

pub use build::SortedWindows;
use side::SIDE_DROP;
pub use side::{Ranked, Side, SIDE_AT, TOP_K};

use crate::arena::{Arena, Node, NONE};

/// The root is slot 0 of every trie and is not counted against the capacity.
pub const ROOT: u32 = 0;

pub struct Trie {
    pub(crate) arena: Arena,
    sides: Vec<Side>,
    free_sides: Vec<u32>,
    /// Nodes this trie may still allocate (reserved from the shared budget by the caller).
    pub(crate) allowance: u64,
    /// Bumped whenever a node is freed: cursors into the trie from an older epoch are stale.
    pub(crate) epoch: u64,
    /// CLOCK hand of the eviction sweep.
    pub(crate) hand: u32,
    /// True once eviction decayed or freed anything: side-table rankings may be approximate.
    pub(crate) evicted: bool,
    /// Whether `linked_by` is maintained (history tries, which evict); own tries skip it.
    pub(crate) count_link_refs: bool,
}

impl Default for Trie {
    fn default() -> Self {
        Self::new()
    }
}

pub struct Children<'a> {
    trie: &'a Trie,
    next: u32,
}

impl Iterator for Children<'_> {
    /// (token, child index)
    type Item = (u32, u32);

    #[inline]
    fn next(&mut self) -> Option<(u32, u32)> {
        if self.next == NONE {
            return None;
        }
        let c = self.next;
        let n = self.trie.node(c);
        self.next = n.next_sibling;
        Some((n.token, c))
    }
}

impl Trie {
    pub fn new() -> Self {
        Trie::with_hint(0)
    }

    /// A trie expecting about `nodes` nodes.
    pub fn with_hint(nodes: u64) -> Self {
        let mut arena = Arena::with_hint(nodes);
        arena.alloc(Node::new(0, NONE));
        Trie {
            arena,
            sides: Vec::new(),
            free_sides: Vec::new(),
            allowance: 0,
            epoch: 0,
            hand: 1,
            evicted: false,
            count_link_refs: true,
        }
    }

    /// Nodes stored, root excluded (what counts against the capacity).
    pub fn nodes(&self) -> u64 {
        u64::from(self.arena.live()) - 1
    }

    /// Approximate heap bytes: node segments plus side tables.
    pub fn bytes(&self) -> usize {
        let side: usize = self
            .sides
            .iter()
            .map(|m| {
                m.map.capacity() * (std::mem::size_of::<(u32, u32)>() + 1)
                    + m.top.capacity() * std::mem::size_of::<Ranked>()
            })
            .sum();
        self.arena.bytes() + side + self.sides.capacity() * std::mem::size_of::<Side>()
    }

    #[inline]
    pub fn node(&self, i: u32) -> &Node {
        self.arena.get(i)
    }

    /// Child of `n` with `token`, or `NONE`.
    #[inline]
    pub fn find_child(&self, n: u32, token: u32) -> u32 {
        let node = self.arena.get(n);
        if node.side != NONE {
            return self.sides[node.side as usize]
                .map
                .get(&token)
                .copied()
                .unwrap_or(NONE);
        }
        let mut c = node.first_child;
        while c != NONE {
            let cn = self.arena.get(c);
            if cn.token == token {
                return c;
            }
            c = cn.next_sibling;
        }
        NONE
    }

    /// Node of the n-gram `path`, or `NONE`.
    pub fn walk(&self, path: &[u32]) -> u32 {
        let mut n = ROOT;
        for &t in path {
            n = self.find_child(n, t);
            if n == NONE {
                return NONE;
            }
        }
        n
    }

    /// Child of `n` with `token`, created (count 0) if missing; `NONE` when the allowance is
    /// spent.
    pub fn child_or_insert(&mut self, n: u32, token: u32) -> u32 {
        let node = self.arena.get(n);
        let (side, first_child) = (node.side, node.first_child);
        let mut fanout = 0usize;
        if side != NONE {
            if let Some(&c) = self.sides[side as usize].map.get(&token) {
                return c;
            }
        } else {
            let mut c = first_child;
            while c != NONE {
                let cn = self.arena.get(c);
                if cn.token == token {
                    return c;
                }
                fanout += 1;
                c = cn.next_sibling;
            }
        }
        if self.allowance == 0 {
            return NONE;
        }
        self.allowance -= 1;
        let mut child = Node::new(token, n);
        child.next_sibling = first_child;
        let c = self.arena.alloc(child);
        if first_child != NONE {
            self.arena.get_mut(first_child).prev_sibling = c;
        }
        self.arena.get_mut(n).first_child = c;
        if side != NONE {
            self.sides[side as usize].map.insert(token, c);
            self.rerank(side, c, 0);
        } else if fanout + 1 > SIDE_AT {
            self.make_side(n);
        }
        c
    }

    /// Counts one more occurrence of the n-gram `n + token` (created if missing) and sets
    /// its suffix link to `link` if unset: `child_or_insert`, `bump` and `set_link` in one,
    /// the way counting a text calls them for every n-gram. `NONE` when the allowance is
    /// spent.
    #[inline]
    pub fn count_child(&mut self, n: u32, token: u32, link: u32) -> u32 {
        let c = self.child_or_insert(n, token);
        if c != NONE {
            self.bump(c, 1);
            self.set_link(c, link);
        }
        c
    }

    /// Adds `by` to the count of `n`, keeping its parent's side table ranked.
    #[inline]
    pub fn bump(&mut self, n: u32, by: u32) {
        let node = self.arena.get_mut(n);
        let old = node.count;
        node.count = old.saturating_add(by);
        // What the count really grew by (less than `by` once it saturates): the side
        // table's sum must stay the sum of the children's counts.
        let added = node.count - old;
        let p = node.parent;
        if p == NONE {
            return;
        }
        let s = self.arena.get(p).side;
        if s != NONE {
            self.rerank(s, n, u64::from(added));
        }
    }

    /// Sets the suffix link of `n` (if unset) to `target`, the node of `n`'s n-gram without
    /// its first token.
    #[inline]
    pub fn set_link(&mut self, n: u32, target: u32) {
        if self.arena.get(n).link != NONE || target == NONE {
            return;
        }
        self.arena.get_mut(n).link = target;
        if target != ROOT {
            self.arena.get_mut(target).linked_by += 1;
        }
    }

    /// Sets every missing suffix link (breadth first: a node's link is the child, by its
    /// token, of its parent's link). Used after loading a saved trie.
    pub fn compute_links(&mut self) {
        let mut queue = vec![ROOT];
        let mut i = 0;
        while i < queue.len() {
            let n = queue[i];
            i += 1;
            let kids: Vec<(u32, u32)> = self.children(n).collect();
            let plink = self.node(n).link;
            for (tok, c) in kids {
                let target = if n == ROOT {
                    ROOT
                } else if plink == NONE {
                    NONE
                } else {
                    self.find_child(plink, tok)
                };
                self.set_link(c, target);
                queue.push(c);
            }
        }
    }

    /// Halves the count of `n` (eviction's decay), keeping its parent's sum exact.
    pub(crate) fn decay(&mut self, n: u32) {
        self.evicted = true;
        let node = self.arena.get_mut(n);
        let old = node.count;
        node.count = old >> 1;
        let p = node.parent;
        let s = self.arena.get(p).side;
        if s != NONE {
            let side = &mut self.sides[s as usize];
            side.sum -= u64::from(old - (old >> 1));
            if old == 1 {
                side.positive -= 1;
            }
            if let Some(r) = side.top.iter_mut().find(|r| r.child == n) {
                r.count = old >> 1;
            }
        }
    }

    /// Iterates the children of `n` (sibling list order).
    pub fn children(&self, n: u32) -> Children<'_> {
        Children {
            trie: self,
            next: self.arena.get(n).first_child,
        }
    }

    /// Iterates the children of `n` as (token, child index, count).
    #[inline]
    pub fn counted_children(&self, n: u32) -> impl Iterator<Item = (u32, u32, u32)> + '_ {
        self.children(n)
            .map(|(tok, c)| (tok, c, self.node(c).count))
    }

    /// True if `n` has a child with a positive count.
    pub fn has_continuation(&self, n: u32) -> bool {
        self.counted_children(n).any(|(_, _, cnt)| cnt > 0)
    }

    /// Unlinks and frees leaf `i` (not the root).
    pub fn free_leaf(&mut self, i: u32) {
        let node = *self.arena.get(i);
        debug_assert!(i != ROOT && node.first_child == NONE && !node.is_free());
        if node.prev_sibling != NONE {
            self.arena.get_mut(node.prev_sibling).next_sibling = node.next_sibling;
        } else {
            self.arena.get_mut(node.parent).first_child = node.next_sibling;
        }
        if node.next_sibling != NONE {
            self.arena.get_mut(node.next_sibling).prev_sibling = node.prev_sibling;
        }
        let ps = self.arena.get(node.parent).side;
        if ps != NONE {
            let side = &mut self.sides[ps as usize];
            side.map.remove(&node.token);
            side.top.retain(|r| r.child != i);
            side.sum -= u64::from(node.count);
            side.positive -= u32::from(node.count > 0);
            if side.map.len() < SIDE_DROP {
                self.sides[ps as usize] = Side::default();
                self.free_sides.push(ps);
                self.arena.get_mut(node.parent).side = NONE;
            }
        }
        if node.side != NONE {
            self.sides[node.side as usize] = Side::default();
            self.free_sides.push(node.side);
        }
        if node.link != NONE && node.link != ROOT {
            self.arena.get_mut(node.link).linked_by -= 1;
        }
        self.arena.free(i);
        self.epoch += 1;
        self.evicted = true;
    }
}
