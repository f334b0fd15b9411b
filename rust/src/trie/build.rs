//! Indexing windows: one at a time, or a whole prompt at once from its sorted windows.

use crate::arena::{Node, NONE};

use super::side::SIDE_AT;
use super::{Trie, ROOT};

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

impl Trie {
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
        // An own trie is never evicted, so its link targets need no reference counts.
        t.count_link_refs = false;
        debug_assert_eq!(t.allowance, 0);
        t
    }
}
