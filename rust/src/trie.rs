//! One n-gram trie: window insertion, child lookup, leaf removal and invariant checks.
//!
//! A node stands for the n-gram spelled by the path from the root; its `count` is the number
//! of indexed occurrences of that n-gram. Small fan-out is a sibling list scan; above
//! `SIDE_AT` children a node gets a hash side table (token -> child), so the root and other
//! hot nodes look up in O(1).

use rustc_hash::FxHashMap;

use crate::arena::{Arena, Node, NONE};
use crate::error::{Error, Result};

/// Children at which a node gets a hash side table.
pub const SIDE_AT: usize = 8;
/// Children below which a side table is dropped again (hysteresis against flapping).
const SIDE_DROP: usize = 4;
/// The root is slot 0 of every trie and is not counted against the capacity.
pub const ROOT: u32 = 0;
/// Children a side table ranks (`Side::top`).
pub const TOP_K: usize = 16;

/// One ranked child of a side table, with copies of its token and count: ranking and
/// drafting read this array instead of visiting each child node (a cache miss apiece).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ranked {
    pub child: u32,
    pub token: u32,
    pub count: u32,
}

impl Ranked {
    /// True if `self` ranks before `o`: higher count, then smaller token.
    #[inline]
    fn before(&self, o: &Ranked) -> bool {
        self.count > o.count || (self.count == o.count && self.token < o.token)
    }
}

/// Lookup and ranking state of a node with many children.
#[derive(Default)]
pub struct Side {
    owner: u32,
    /// token -> child
    map: FxHashMap<u32, u32>,
    /// Sum of the children's counts.
    pub sum: u64,
    /// Children with a positive count (the `D` of the draft score; count-0 children exist
    /// after eviction's decay and as prefixes created by a cursor rebuild).
    pub positive: u32,
    /// The best `TOP_K` children by (count desc, token asc), best first: exact while counts
    /// only grow (a bump moves a child up; a child overtaking the last one replaces it);
    /// approximate once eviction decayed or freed children. Each entry's count is the
    /// child's count.
    pub top: Vec<Ranked>,
}

impl Side {
    /// Children of the owner (some may have count 0 once eviction decayed them).
    pub fn num_children(&self) -> usize {
        self.map.len()
    }
}

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
    /// Whether `linked_by` is maintained (history tries, which evict); prompt tries skip it.
    pub(crate) count_link_refs: bool,
}

impl Default for Trie {
    fn default() -> Self {
        Self::new()
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

    fn make_side(&mut self, n: u32) {
        let s = match self.free_sides.pop() {
            Some(s) => s,
            None => {
                self.sides.push(Side::default());
                (self.sides.len() - 1) as u32
            }
        };
        self.arena.get_mut(n).side = s;
        self.rank_side(s, n);
    }

    /// Rebuilds side table `s` of node `n` from its children: map, sum and exact top list.
    fn rank_side(&mut self, s: u32, n: u32) {
        let mut side = std::mem::take(&mut self.sides[s as usize]);
        side.owner = n;
        side.map.clear();
        side.sum = 0;
        side.positive = 0;
        let mut all = Vec::new();
        let mut c = self.arena.get(n).first_child;
        while c != NONE {
            let cn = self.arena.get(c);
            side.map.insert(cn.token, c);
            side.sum += u64::from(cn.count);
            side.positive += u32::from(cn.count > 0);
            all.push((std::cmp::Reverse(cn.count), cn.token, c));
            c = cn.next_sibling;
        }
        if all.len() > TOP_K {
            all.select_nth_unstable(TOP_K - 1);
            all.truncate(TOP_K);
        }
        all.sort_unstable();
        side.top.clear();
        side.top.extend(all.iter().map(|e| Ranked {
            child: e.2,
            token: e.1,
            count: e.0 .0,
        }));
        self.sides[s as usize] = side;
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

    fn rerank(&mut self, s: u32, c: u32, added: u64) {
        let n = self.arena.get(c);
        let me = Ranked {
            child: c,
            token: n.token,
            count: n.count,
        };
        let evicted = self.evicted;
        let side = &mut self.sides[s as usize];
        side.sum += added;
        if added > 0 && u64::from(me.count) == added {
            side.positive += 1; // was 0
        }
        let top = &mut side.top;
        // While the list is exactly ranked, a child below the last entry is not in it (an
        // entry's count only grows): no scan of the list for the long tail.
        if !evicted && top.len() == TOP_K && me.count < top[TOP_K - 1].count {
            return;
        }
        let mut i = match top.iter().position(|r| r.child == c) {
            Some(i) => i,
            None if top.len() < TOP_K => {
                top.push(me);
                top.len() - 1
            }
            None if me.before(top.last().expect("TOP_K > 0")) => top.len() - 1,
            None => return,
        };
        top[i] = me;
        while i > 0 && top[i].before(&top[i - 1]) {
            top.swap(i, i - 1);
            i -= 1;
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

    /// The side table of `n`, if it has one (many children).
    #[inline]
    pub fn side(&self, n: u32) -> Option<&Side> {
        let s = self.arena.get(n).side;
        (s != NONE).then(|| &self.sides[s as usize])
    }

    /// Counts one occurrence of every prefix of `window` (one window of the text).
    /// Returns false if the allowance ran out before the whole window was stored.
    pub fn add_window(&mut self, window: &[u32]) -> bool {
        let mut n = ROOT;
        for &t in window {
            n = self.child_or_insert(n, t);
            if n == NONE {
                return false;
            }
            self.bump(n, 1);
        }
        true
    }

    /// Indexes every window of `text` that starts in `starts`, each up to `depth` tokens.
    /// Returns the first start not fully indexed (== starts.end when all fit).
    pub fn add_windows(
        &mut self,
        text: &[u32],
        depth: usize,
        starts: std::ops::Range<usize>,
    ) -> usize {
        for s in starts.clone() {
            let end = (s + depth).min(text.len());
            if !self.add_window(&text[s..end]) {
                return s;
            }
        }
        starts.end
    }

    /// The trie of every window of `text` (each up to `depth` tokens), built by sorting the
    /// windows: nodes are created in one pass in depth-first order (no lookups, contiguous
    /// memory) and counts are the sizes of the sorted ranges sharing a prefix.
    pub fn from_windows(text: &[u32], depth: usize) -> Trie {
        Trie::from_sorted(text, depth, &SortedWindows::new(text, depth))
    }

    /// `from_windows` with the windows already sorted (their node count `sw.nodes` is known
    /// before building, so the caller can reserve exactly that).
    pub fn from_sorted(text: &[u32], depth: usize, sw: &SortedWindows) -> Trie {
        let n = text.len();
        let win = |s: u32| &text[s as usize..(s as usize + depth).min(n)];
        let (order, lcp) = (&sw.order, &sw.lcp);
        let mut t = Trie::with_hint(sw.nodes);
        t.allowance = sw.nodes;
        // stack[d]: (node, first sorted window through it, children so far) at depth d+1.
        let mut stack: Vec<(u32, usize, usize)> = Vec::with_capacity(depth);
        let mut root_children = 0usize;
        // Nodes that get a side table, made once their children and counts are final.
        let mut sided = Vec::new();
        // Suffix links only where a draft's re-match starts: a full window's leaf links to
        // the (depth-1)-gram after its first token, `below[p]`, the node of
        // text[p..p + depth - 1]. Links at every depth would cost a second pass over all
        // nodes with random reads (a third of the build); a re-match that needs a shorter
        // suffix walks from the root instead.
        let mut below = vec![NONE; if depth >= 2 { n } else { 0 }];
        let mut leaves: Vec<(u32, u32)> = Vec::new();
        for i in 0..n {
            let w = win(order[i]);
            let l = usize::from(lcp[i]);
            let p = order[i] as usize;
            // The last node popped (depth l + 1) is the previous sibling of the next one
            // created: siblings come in token order, and every write below hits a node that
            // was touched a moment ago (no cache misses on long-finished subtrees).
            let mut prev = NONE;
            while stack.len() > l {
                let (node, start, kids) = stack.pop().expect("non-empty");
                t.arena.get_mut(node).count = (i - start).min(u32::MAX as usize) as u32;
                if kids > SIDE_AT {
                    sided.push(node);
                }
                prev = node;
            }
            for &tok in &w[l..] {
                let parent = match stack.last_mut() {
                    Some(top) => {
                        top.2 += 1;
                        top.0
                    }
                    None => {
                        root_children += 1;
                        ROOT
                    }
                };
                let mut node = Node::new(tok, parent);
                node.prev_sibling = prev;
                t.allowance -= 1;
                let c = t.arena.alloc(node);
                if prev == NONE {
                    t.arena.get_mut(parent).first_child = c;
                } else {
                    t.arena.get_mut(prev).next_sibling = c;
                }
                prev = NONE;
                stack.push((c, i, 0));
            }
            if depth >= 2 && stack.len() + 1 >= depth {
                below[p] = stack[depth - 2].0;
                if stack.len() == depth && l < depth {
                    leaves.push((stack[depth - 1].0, p as u32));
                }
            }
        }
        while let Some((node, start, kids)) = stack.pop() {
            t.arena.get_mut(node).count = (n - start).min(u32::MAX as usize) as u32;
            if kids > SIDE_AT {
                sided.push(node);
            }
        }
        if root_children > SIDE_AT {
            sided.push(ROOT);
        }
        for node in sided {
            t.make_side(node);
        }
        for (leaf, p) in leaves {
            // Window p is full, so text[p + 1..p + depth] exists and window p + 1 reaches it.
            t.arena.get_mut(leaf).link = below[p as usize + 1];
        }
        // A prompt trie is never evicted, so its link targets need no reference counts.
        t.count_link_refs = false;
        debug_assert_eq!(t.allowance, 0);
        t
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
        self.arena = arena;
        self.sides = Vec::new();
        self.free_sides = Vec::new();
        for n in sided {
            self.make_side(n);
        }
        self.epoch += 1;
        self.hand = 1;
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

/// The windows of a text in sorted order, with the longest common prefix of each window and
/// its predecessor: exactly the information that fixes the trie's shape.
pub struct SortedWindows {
    order: Vec<u32>,
    lcp: Vec<u8>,
    /// Nodes the trie of these windows has (root excluded).
    pub nodes: u64,
}

impl SortedWindows {
    pub fn new(text: &[u32], depth: usize) -> Self {
        assert!(depth <= usize::from(u8::MAX) && text.len() < u32::MAX as usize);
        let n = text.len();
        let win = |s: u32| &text[s as usize..(s as usize + depth).min(n)];
        let mut order: Vec<u32> = (0..n as u32).collect();
        order.sort_unstable_by(|&a, &b| win(a).cmp(win(b)));
        let mut lcp = vec![0u8; n];
        let mut nodes = 0u64;
        for i in 0..n {
            let w = win(order[i]);
            let l = if i == 0 {
                0
            } else {
                let p = win(order[i - 1]);
                p.iter().zip(w).take_while(|(a, b)| a == b).count()
            };
            lcp[i] = l as u8;
            nodes += (w.len() - l) as u64;
        }
        SortedWindows { order, lcp, nodes }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn naive(text: &[u32], depth: usize) -> HashMap<Vec<u32>, u32> {
        let mut m = HashMap::new();
        for s in 0..text.len() {
            for e in s + 1..=(s + depth).min(text.len()) {
                *m.entry(text[s..e].to_vec()).or_insert(0) += 1;
            }
        }
        m
    }

    #[test]
    fn counts_equal_naive_recount() {
        let text: Vec<u32> = (0..400u32).map(|i| (i * 7 + i / 13) % 23).collect();
        let mut t = Trie::new();
        t.allowance = u64::MAX;
        assert_eq!(t.add_windows(&text, 5, 0..text.len()), text.len());
        t.check().unwrap();
        let got: HashMap<_, _> = t.ngrams().into_iter().collect();
        assert_eq!(got, naive(&text, 5));
    }

    #[test]
    fn sorted_build_equals_incremental() {
        for (len, alpha, depth) in [
            (0usize, 3u32, 3usize),
            (1, 3, 3),
            (500, 3, 6),
            (2000, 50, 12),
            (300, 1, 4),
        ] {
            let text: Vec<u32> = (0..len as u32)
                .map(|i| (i * i + 7 * i) % alpha.max(1) + (i % 5 == 0) as u32)
                .collect();
            let t = Trie::from_windows(&text, depth);
            t.check().unwrap();
            let got: HashMap<_, _> = t.ngrams().into_iter().collect();
            assert_eq!(got, naive(&text, depth));
            assert_eq!(t.nodes(), got.len() as u64);
            assert_eq!(SortedWindows::new(&text, depth).nodes, t.nodes());
        }
    }

    #[test]
    fn side_tables_appear_and_go() {
        let mut t = Trie::new();
        t.allowance = u64::MAX;
        for tok in 0..20u32 {
            t.add_window(&[tok]);
        }
        assert_ne!(t.node(ROOT).side, NONE);
        t.check().unwrap();
        for tok in 0..18u32 {
            let c = t.find_child(ROOT, tok);
            t.free_leaf(c);
            t.check().unwrap();
        }
        assert_eq!(t.node(ROOT).side, NONE);
        assert_eq!(t.nodes(), 2);
        assert_ne!(t.find_child(ROOT, 19), NONE);
    }

    #[test]
    fn compaction_keeps_ngrams_and_frees_slots() {
        let text: Vec<u32> = (0..3000u32).map(|i| (i * 31 + i / 7) % 97).collect();
        let mut t = Trie::new();
        t.allowance = u64::MAX;
        t.add_windows(&text, 6, 0..text.len());
        // Links as a history trie keeps them, so compaction must carry them over.
        t.compute_links();
        while t.free_slots() < t.nodes() {
            t.sweep(4096, 64);
        }
        t.check().unwrap();
        let before: HashMap<_, _> = t.ngrams().into_iter().collect();
        let (bytes, epoch) = (t.bytes(), t.epoch);
        t.compact();
        t.check().unwrap();
        assert_eq!(t.free_slots(), 0);
        assert!(t.bytes() < bytes, "{} >= {bytes}", t.bytes());
        assert!(t.epoch > epoch);
        let after: HashMap<_, _> = t.ngrams().into_iter().collect();
        assert_eq!(after, before);
        // Still a working trie: it grows and evicts as before.
        t.allowance = 1000;
        t.add_windows(&text, 6, 0..200);
        t.sweep(10_000, 10);
        t.check().unwrap();
    }

    #[test]
    fn allowance_bounds_insertion() {
        let mut t = Trie::new();
        t.allowance = 10;
        let text: Vec<u32> = (0..100).collect();
        let stop = t.add_windows(&text, 4, 0..100);
        assert!(stop < 100);
        assert_eq!(t.nodes(), 10);
        t.check().unwrap();
    }
}
