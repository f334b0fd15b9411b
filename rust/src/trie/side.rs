//! Side tables: a node with `SIDE_AT` or more children keeps a token -> child map and its
//! `TOP_K` children ranked by count, which drafting reads instead of the sibling list.

use rustc_hash::FxHashMap;

use crate::arena::NONE;

use super::Trie;

/// Children at which a node gets a hash side table.
pub const SIDE_AT: usize = 8;

/// Children below which a side table is dropped again (hysteresis against flapping).
pub(super) const SIDE_DROP: usize = 4;

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
    pub(super) fn before(&self, o: &Ranked) -> bool {
        self.count > o.count || (self.count == o.count && self.token < o.token)
    }
}

/// Lookup and ranking state of a node with many children.
#[derive(Default)]
pub struct Side {
    pub(super) owner: u32,
    /// token -> child
    pub(super) map: FxHashMap<u32, u32>,
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

impl Trie {
    pub(super) fn make_side(&mut self, n: u32) {
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
    pub(super) fn rank_side(&mut self, s: u32, n: u32) {
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

    pub(super) fn rerank(&mut self, s: u32, c: u32, added: u64) {
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

    /// The side table of `n`, if it has one (many children).
    #[inline]
    pub fn side(&self, n: u32) -> Option<&Side> {
        let s = self.arena.get(n).side;
        (s != NONE).then(|| &self.sides[s as usize])
    }
}
