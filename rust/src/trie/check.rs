//! Invariant checks, compaction of freed slots, and the n-gram listing tests compare.

use crate::arena::{Arena, Node, NONE};
use crate::error::{Error, Result};

use super::side::{SIDE_AT, TOP_K};
use super::{Trie, ROOT};

impl Trie {
    /// Structural checks: links, side tables, unique child tokens, free list, node count.
    pub fn check(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Invariant(m));
        let slots = self.arena.slots();
        let free = self.arena.free_list();
        if free.len() != self.arena.free_len() as usize {
            return bad(format!(
                "free list has {} entries, expected {}",
                free.len(),
                self.arena.free_len()
            ));
        }
        for &f in &free {
            if !self.arena.get(f).is_free() {
                return bad(format!("slot {f} on the free list is live"));
            }
        }
        if self.arena.get(ROOT).is_free() || self.arena.get(ROOT).parent != NONE {
            return bad("root is missing".into());
        }
        let mut seen_children = 0u64;
        let mut linked_by = vec![0u32; slots as usize];
        let mut used_sides = 0usize;
        for i in 0..slots {
            let n = self.arena.get(i);
            if n.is_free() {
                continue;
            }
            if i != ROOT {
                let p = n.parent;
                if p >= slots || self.arena.get(p).is_free() {
                    return bad(format!("node {i} has a dead parent {p}"));
                }
                if self.find_child(p, n.token) != i {
                    return bad(format!(
                        "node {i} (token {}) not found under its parent {p}",
                        n.token
                    ));
                }
            }
            if n.link != NONE {
                if i == ROOT || n.link >= slots || self.arena.get(n.link).is_free() {
                    return bad(format!("node {i} links to a dead node {}", n.link));
                }
                let (mine, theirs) = (self.path(i), self.path(n.link));
                if mine[1..] != theirs[..] {
                    return bad(format!("node {i} {mine:?} links to {theirs:?}"));
                }
                linked_by[n.link as usize] += 1;
            }
            let mut tokens = Vec::new();
            let mut prev = NONE;
            let mut c = n.first_child;
            while c != NONE {
                let cn = self.arena.get(c);
                if cn.is_free() || cn.parent != i || cn.prev_sibling != prev {
                    return bad(format!("child list of node {i} is broken at {c}"));
                }
                tokens.push(cn.token);
                prev = c;
                c = cn.next_sibling;
                if tokens.len() > slots as usize {
                    return bad(format!("child list of node {i} has a cycle"));
                }
            }
            seen_children += tokens.len() as u64;
            let k = tokens.len();
            tokens.sort_unstable();
            tokens.dedup();
            if tokens.len() != k {
                return bad(format!("node {i} has duplicate child tokens"));
            }
            if n.side != NONE {
                used_sides += 1;
                let side = &self.sides[n.side as usize];
                if side.map.len() != k || side.owner != i {
                    return bad(format!(
                        "side table of node {i} has {} entries for {k} children",
                        side.map.len()
                    ));
                }
                let sum: u64 = self
                    .children(i)
                    .map(|(_, c)| u64::from(self.node(c).count))
                    .sum();
                if side.sum != sum {
                    return bad(format!(
                        "side table of node {i} sums {} for {sum}",
                        side.sum
                    ));
                }
                let positive = self.counted_children(i).filter(|k| k.2 > 0).count();
                if side.positive as usize != positive {
                    return bad(format!(
                        "side table of node {i} counts {} positive children for {positive}",
                        side.positive
                    ));
                }
                if side
                    .top
                    .iter()
                    .any(|r| r.child >= slots || self.node(r.child).parent != i)
                {
                    return bad(format!("side table of node {i} ranks a non-child"));
                }
                if side.top.iter().any(|r| {
                    let n = self.node(r.child);
                    (n.token, n.count) != (r.token, r.count)
                }) {
                    return bad(format!("side table of node {i} holds a stale count"));
                }
                // Without eviction the ranking is exact.
                if !self.evicted {
                    let mut all: Vec<(std::cmp::Reverse<u32>, u32, u32)> = self
                        .children(i)
                        .map(|(t, c)| (std::cmp::Reverse(self.node(c).count), t, c))
                        .collect();
                    all.sort_unstable();
                    let want: Vec<u32> = all.iter().take(TOP_K).map(|e| e.2).collect();
                    let have: Vec<u32> = side.top.iter().map(|r| r.child).collect();
                    if have != want {
                        return bad(format!(
                            "side table of node {i} ranks {:?}, want {want:?}",
                            side.top
                        ));
                    }
                }
            } else if k > SIDE_AT {
                return bad(format!("node {i} has {k} children and no side table"));
            }
        }
        if seen_children != self.nodes() {
            return bad(format!(
                "{} nodes reachable as children, {} live",
                seen_children,
                self.nodes()
            ));
        }
        for i in 1..slots {
            let n = self.arena.get(i);
            if self.count_link_refs && !n.is_free() && n.linked_by != linked_by[i as usize] {
                return bad(format!(
                    "node {i} is linked by {} nodes, claims {}",
                    linked_by[i as usize], n.linked_by
                ));
            }
        }
        if used_sides + self.free_sides.len() != self.sides.len() {
            return bad("side table slots leak".into());
        }
        Ok(())
    }

    /// Free slots: what eviction left in this arena and only this trie can reuse.
    pub fn free_slots(&self) -> u64 {
        u64::from(self.arena.free_len())
    }

    /// Moves the live nodes into a fresh, dense arena (same n-grams, counts and suffix
    /// links; side tables rebuilt, so their rankings are exact again) and returns the old
    /// arena's memory to the allocator. One pass over the slots; node indices change, so
    /// the epoch moves on and every cursor into the trie goes stale.
    pub fn compact(&mut self) {
        *self = self.compacted();
    }

    /// What `compact` turns this trie into, built from a shared borrow: a history is
    /// compacted under its read lock (drafts go on reading it) and swapped in after.
    pub fn compacted(&self) -> Trie {
        let slots = self.arena.slots();
        let mut to = vec![NONE; slots as usize];
        let mut live = 0u32;
        for i in 0..slots {
            if !self.arena.get(i).is_free() {
                to[i as usize] = live;
                live += 1;
            }
        }
        let map = |i: u32| if i == NONE { NONE } else { to[i as usize] };
        let mut arena = Arena::with_hint(u64::from(live));
        let mut sided = Vec::new();
        for i in 0..slots {
            let n = self.arena.get(i);
            if n.is_free() {
                continue;
            }
            if n.side != NONE {
                sided.push(to[i as usize]);
            }
            let moved = Node {
                parent: map(n.parent),
                first_child: map(n.first_child),
                next_sibling: map(n.next_sibling),
                prev_sibling: map(n.prev_sibling),
                side: NONE,
                link: map(n.link),
                ..*n
            };
            arena.alloc(moved);
        }
        let mut out = Trie {
            arena,
            sides: Vec::new(),
            free_sides: Vec::new(),
            allowance: self.allowance,
            epoch: self.epoch + 1,
            hand: 1,
            evicted: self.evicted,
            count_link_refs: self.count_link_refs,
        };
        for n in sided {
            out.make_side(n);
        }
        out
    }

    /// The n-gram of node `n` (root to `n`).
    pub fn path(&self, mut n: u32) -> Vec<u32> {
        let mut p = Vec::new();
        while n != ROOT {
            p.push(self.node(n).token);
            n = self.node(n).parent;
        }
        p.reverse();
        p
    }

    /// Every live non-root node as (n-gram, count); for tests and persistence.
    pub fn ngrams(&self) -> Vec<(Vec<u32>, u32)> {
        let mut out = Vec::new();
        let mut stack = vec![(ROOT, Vec::new())];
        while let Some((n, path)) = stack.pop() {
            for (t, c) in self.children(n) {
                let mut p = path.clone();
                p.push(t);
                out.push((p.clone(), self.node(c).count));
                stack.push((c, p));
            }
        }
        out
    }
}
