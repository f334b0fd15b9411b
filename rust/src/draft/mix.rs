//! Mixing drafts of several sources (the request's own draft and each corpus's) into one.
//!
//! Each source drafts on its own with the same budget; the mixed tree is the union of their
//! paths, each path `p` scored
//!
//! ```text
//! score(p) = sum_x w_x * s_x(p) / sum_x w_x
//! ```
//!
//! over the sources `x` whose draft has at least one node (a source without a match takes
//! no part, so a lone answering source keeps its scores and its tree unchanged), `s_x(p)`
//! being `p`'s score in source `x`'s draft (0 where that draft lacks it). Every `s_x` is a
//! product along the path, so `score` never grows from a node to its child, and the best
//! `budget` nodes by score (ties: shallower first) include every kept node's parent. A
//! mixture of the sources' estimates stays an estimate of the chance that the target
//! accepts the path, which is what cost-aware sizing reads; a node's `matched` is the longest
//! match of the sources that drafted it. Single-branch drafts keep the
//! chain that follows the best-scored child at each step.

use rustc_hash::FxHashMap;

use super::{reported_score, DraftTree};

/// Mixes `drafts` (each with its weight `> 0`, all drafted after the same root) into one
/// draft of at most `budget` nodes beyond the root.
pub fn mix(drafts: &[(DraftTree, f64)], budget: usize, multi_branch: bool) -> DraftTree {
    let answering: Vec<&(DraftTree, f64)> =
        drafts.iter().filter(|(t, _)| t.num_nodes() > 1).collect();
    match answering.len() {
        0 => return drafts[0].0.clone(),
        1 => return answering[0].0.clone(),
        _ => {}
    }
    let wsum: f64 = answering.iter().map(|(_, w)| w).sum();
    let root = answering[0].0.tokens[0];
    // The union of the paths: node u = (parent, token), its mixed score and depth.
    let mut index: FxHashMap<(u32, u32), u32> = FxHashMap::default();
    let mut tokens = vec![root];
    let mut parents = vec![-1i32];
    let mut scores = vec![1.0f64];
    let mut matched = vec![0u8];
    let mut depth = vec![0u32];
    for (tree, w) in &answering {
        let mut at = vec![0u32; tree.num_nodes()];
        for i in 1..tree.num_nodes() {
            let p = at[tree.parents[i] as usize];
            let u = *index.entry((p, tree.tokens[i])).or_insert_with(|| {
                tokens.push(tree.tokens[i]);
                parents.push(p as i32);
                scores.push(0.0);
                matched.push(0);
                depth.push(depth[p as usize] + 1);
                (tokens.len() - 1) as u32
            });
            scores[u as usize] += w * f64::from(tree.scores[i]) / wsum;
            matched[u as usize] = matched[u as usize].max(tree.matched[i]);
            at[i] = u;
        }
    }
    let keep: Vec<u32> = if multi_branch {
        let mut order: Vec<u32> = (1..tokens.len() as u32).collect();
        order.sort_by(|&a, &b| {
            let (a, b) = (a as usize, b as usize);
            scores[b]
                .total_cmp(&scores[a])
                .then(depth[a].cmp(&depth[b]))
                .then(a.cmp(&b))
        });
        order.truncate(budget);
        order
    } else {
        let mut children: FxHashMap<u32, Vec<u32>> = FxHashMap::default();
        for u in 1..tokens.len() as u32 {
            children
                .entry(parents[u as usize] as u32)
                .or_default()
                .push(u);
        }
        let mut chain = Vec::new();
        let mut at = 0u32;
        while chain.len() < budget {
            let best = children.get(&at).and_then(|c| {
                c.iter().copied().max_by(|&a, &b| {
                    scores[a as usize]
                        .total_cmp(&scores[b as usize])
                        .then(tokens[b as usize].cmp(&tokens[a as usize]))
                })
            });
            let Some(b) = best else { break };
            chain.push(b);
            at = b;
        }
        chain
    };
    // Renumber: kept nodes in order (every parent before its children).
    let mut new_of = vec![u32::MAX; tokens.len()];
    new_of[0] = 0;
    let mut out = DraftTree {
        tokens: vec![root],
        parents: vec![-1],
        scores: vec![1.0],
        matched: vec![0],
    };
    for (j, &u) in keep.iter().enumerate() {
        let u = u as usize;
        new_of[u] = (j + 1) as u32;
        let p = new_of[parents[u] as usize];
        debug_assert!(p != u32::MAX, "a kept node's parent was not kept before it");
        out.tokens.push(tokens[u]);
        out.parents.push(p as i32);
        out.scores.push(reported_score(scores[u]));
        out.matched.push(matched[u]);
    }
    out
}
