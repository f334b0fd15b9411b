use super::scoring::Row;
use super::*;
use crate::trie::TOP_K;

fn trie(texts: &[&[u32]], depth: usize) -> Trie {
    let mut t = Trie::new();
    t.allowance = u64::MAX;
    for x in texts {
        t.add_windows(x, depth, 0..x.len());
    }
    t
}

fn src<'a>(p: Option<&'a Trie>, h: Option<&'a Trie>, depth: usize) -> Sources<'a> {
    Sources {
        own: p,
        history: h,
        own_weight: 1.0,
        history_weight: 1.0,
        max_depth: depth,
        suffixes: [&[], &[]],
        history_skip: None,
        recycled: None,
    }
}

#[test]
fn nothing_matched_gives_the_root_alone() {
    let p = trie(&[&[1, 2, 3]], 4);
    let d = src(Some(&p), None, 4).draft(&[9], 8, true);
    assert_eq!(d.tokens, vec![9]);
    assert_eq!(d.parents, vec![-1]);
}

#[test]
fn chain_copies_beyond_max_depth() {
    let text: Vec<u32> = (10..40).collect();
    let p = trie(&[&text], 3);
    let d = src(Some(&p), None, 3).draft(&[10, 11], 20, false);
    assert_eq!(d.tokens, (11..32).collect::<Vec<u32>>());
    assert_eq!(d.parents, (-1..20).collect::<Vec<i32>>());
}

#[test]
fn scores_mix_prompt_and_history() {
    // After [5]: prompt says 6 (x1: 1 / (1 + 1)), history says 7 (x3) and 6 (x1): / (4 + 2).
    let p = trie(&[&[5, 6]], 3);
    let h = trie(&[&[5, 7], &[5, 7], &[5, 7], &[5, 6]], 3);
    let s = src(Some(&p), Some(&h), 3);
    let mut c = Vec::new();
    s.candidates(
        s.match_suffix(&[5]).unwrap(),
        8,
        &mut Scratch::default(),
        &mut c,
    );
    assert_eq!(c[0].token, 6);
    assert!((c[0].score - (0.5 + 1.0 / 6.0) / 2.0).abs() < 1e-12);
    assert_eq!(c[1].token, 7);
    assert!((c[1].score - 0.5 / 2.0).abs() < 1e-12);
    let d = s.draft(&[5], 4, true);
    assert_eq!(&d.tokens[..3], &[5, 6, 7]);
    assert_eq!(&d.parents[..3], &[-1, 0, 0]);
}

#[test]
fn candidates_score_each_tries_listed_children_exactly() {
    let mut x = 7u64;
    let mut rnd = |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % n) as u32
    };
    // Skewed ids: a few frequent tokens, a long tail, so nodes have many children.
    let text = |len: usize, rnd: &mut dyn FnMut(u64) -> u32| -> Vec<u32> {
        (0..len)
            .map(|_| {
                let a = rnd(60);
                a * a / 60
            })
            .collect()
    };
    let pt = text(3000, &mut rnd);
    let ht = text(5000, &mut rnd);
    let p = trie(&[&pt], 4);
    let h = trie(&[&ht], 4);
    for (w_own, w_hist) in [(1.0, 1.0), (1.0, 0.0), (0.0, 2.0), (0.2, 3.0)] {
        let s = Sources {
            own: Some(&p),
            history: Some(&h),
            own_weight: w_own,
            history_weight: w_hist,
            max_depth: 4,
            suffixes: [&[], &[]],
            history_skip: None,
            recycled: None,
        };
        let mut scratch = Scratch::default();
        for ctx_len in [1usize, 2, 3] {
            for _ in 0..60 {
                let ctx: Vec<u32> = (0..ctx_len)
                    .map(|_| {
                        let a = rnd(60);
                        a * a / 60
                    })
                    .collect();
                let Some(st) = s.match_suffix(&ctx) else {
                    continue;
                };
                // The rule: a trie with more than TOP_K children offers its TOP_K best
                // (count desc, token asc); each offered token is scored with both
                // tries' counts, S and D over all children.
                let mut offered = std::collections::BTreeSet::new();
                let mut counts = [std::collections::HashMap::new(), Default::default()];
                let (mut sums, mut kids) = ([0u64; 2], [0u64; 2]);
                for (x, (t, w)) in s.tries().into_iter().enumerate() {
                    let Some(t) = t.filter(|_| w > 0.0 && st.nodes[x] != NONE) else {
                        continue;
                    };
                    let mut ranked: Vec<(u32, u32)> = Vec::new();
                    for (tok, c, cnt) in t.counted_children(st.nodes[x]).filter(|k| k.2 > 0) {
                        counts[x].insert(tok, (cnt, c));
                        sums[x] += u64::from(cnt);
                        kids[x] += 1;
                        ranked.push((cnt, tok));
                    }
                    ranked.sort_unstable_by_key(|&(cnt, tok)| (std::cmp::Reverse(cnt), tok));
                    offered.extend(ranked.iter().take(TOP_K).map(|k| k.1));
                }
                let (w_own, w_hist, dens) = s.weights(sums, kids);
                let mut every: Vec<Cand> = offered
                    .iter()
                    .map(|&tok| {
                        let (cp, np) = counts[0].get(&tok).copied().unwrap_or((0, NONE));
                        let (ch, nh) = counts[1].get(&tok).copied().unwrap_or((0, NONE));
                        Sources::score(
                            &Row {
                                token: tok,
                                counts: [cp, ch],
                                nodes: [np, nh],
                            },
                            dens,
                            w_own,
                            w_hist,
                            w_own + w_hist,
                        )
                    })
                    .collect();
                every.sort_by(|x, y| y.score.total_cmp(&x.score).then(x.token.cmp(&y.token)));
                for room in [1usize, 2, 5, 16, 32, 33, 100] {
                    let (mut a, mut b) = (Vec::new(), every.clone());
                    s.candidates(st, room, &mut scratch, &mut a);
                    b.truncate(room);
                    let key = |v: &Vec<Cand>| {
                        v.iter()
                            .map(|c| {
                                (
                                    c.token,
                                    c.score.to_bits(),
                                    [c.child.nodes[OWN], c.child.nodes[HISTORY]],
                                )
                            })
                            .collect::<Vec<_>>()
                    };
                    assert_eq!(key(&a), key(&b), "ctx {ctx:?} room {room}");
                }
            }
        }
    }
    assert!(p.side(crate::trie::ROOT).is_some() && h.side(crate::trie::ROOT).is_some());
}

#[test]
fn shorter_suffixes_back_off_with_the_escape_mass() {
    // After "1 2": 3 (once: 1/2, escape 1/2). After "2": 3, 4, 5 once each (1/6 each);
    // 3 is excluded, 4 and 5 join at 1/2 * 1/6.
    let p = trie(&[&[1, 2, 3, 9, 2, 4, 7, 2, 5]], 3);
    let d = src(Some(&p), None, 3).draft(&[1, 2], 8, true);
    let root_kids: Vec<(u32, f32)> = (1..d.num_nodes())
        .filter(|&i| d.parents[i] == 0)
        .map(|i| (d.tokens[i], d.scores[i]))
        .collect();
    let twelfth = (0.5f64 * (1.0 / 6.0)) as f32;
    assert_eq!(root_kids, vec![(3, 0.5), (4, twelfth), (5, twelfth)]);
    // A one-token match has no shorter suffix: no backoff.
    let d = src(Some(&p), None, 3).draft(&[4], 8, true);
    assert_eq!(d.tokens[1], 7);
    assert!(d.parents[1..].iter().filter(|&&q| q == 0).count() == 1);
}

#[test]
fn scores_of_long_chains_stay_positive() {
    // Each step of a count-1 chain scores 1/2: 400 steps is 2**-400, below f32's range.
    let text: Vec<u32> = (10..500).collect();
    let p = trie(&[&text], 3);
    for multi in [false, true] {
        let d = src(Some(&p), None, 3).draft(&[10, 11], 400, multi);
        assert!(d.num_nodes() > 300, "{}", d.num_nodes());
        assert!(
            d.scores.iter().all(|x| (MIN_SCORE..=1.0).contains(x)),
            "{:?}",
            &d.scores[300..]
        );
    }
}

#[test]
fn longest_suffix_wins_then_falls_back() {
    let p = trie(&[&[1, 2, 3, 9, 2, 3, 4]], 4);
    let s = src(Some(&p), None, 4);
    // "1 2 3" -> 9; "2 3" alone would prefer a tie between 9 and 4.
    assert_eq!(s.draft(&[1, 2, 3], 1, false).tokens, vec![3, 9]);
    // "8 2 3" is unknown, so "2 3" is used: 4 and 9 tie, smaller token first.
    assert_eq!(s.draft(&[8, 2, 3], 1, false).tokens, vec![3, 4]);
}

fn tree(tokens: &[u32], parents: &[i32], scores: &[f32]) -> DraftTree {
    DraftTree {
        tokens: tokens.to_vec(),
        parents: parents.to_vec(),
        scores: scores.to_vec(),
        matched: vec![0; tokens.len()],
    }
}

#[test]
fn matched_is_the_length_of_the_ngram_a_node_continues() {
    let p = trie(&[&[1, 2, 3, 9, 2, 3, 4]], 4);
    let s = src(Some(&p), None, 4);
    // "1 2 3" -> 9: a 3-token match; "8 2 3" backs off to "2 3".
    assert_eq!(s.draft(&[1, 2, 3], 1, false).matched, vec![0, 3]);
    assert_eq!(s.draft(&[8, 2, 3], 1, false).matched, vec![0, 2]);
    // Down a chain the n-gram grows with the path ("2 3" + 4 ...) up to the window.
    let d = s.draft(&[5, 2, 3], 8, true);
    assert_eq!(d.matched.len(), d.num_nodes());
    for i in 1..d.num_nodes() {
        assert!((1..4).contains(&d.matched[i]), "{d:?}");
    }
}

#[test]
fn mix_keeps_each_nodes_longest_match() {
    let mut a = tree(&[7, 1, 2], &[-1, 0, 1], &[1.0, 0.5, 0.25]);
    a.matched = vec![0, 2, 3];
    let mut b = tree(&[7, 1, 5], &[-1, 0, 1], &[1.0, 0.5, 0.5]);
    b.matched = vec![0, 6, 7];
    let m = mix(&[(a, 1.0), (b, 1.0)], 8, true);
    let of = |t: u32| m.matched[m.tokens.iter().position(|&x| x == t).unwrap()];
    assert_eq!((of(1), of(2), of(5)), (6, 3, 7));
}

#[test]
fn mix_keeps_a_lone_answering_draft_as_it_is() {
    let a = tree(&[7, 1, 2], &[-1, 0, 1], &[1.0, 0.5, 0.25]);
    let empty = tree(&[7], &[-1], &[1.0]);
    assert_eq!(
        super::mix(&[(a.clone(), 1.0), (empty.clone(), 3.0)], 8, true),
        a
    );
    assert_eq!(
        super::mix(&[(empty.clone(), 1.0), (a.clone(), 3.0)], 8, true),
        a
    );
    assert_eq!(super::mix(&[(empty.clone(), 1.0)], 8, true), empty);
}

#[test]
fn mix_scores_paths_by_weighted_mean_and_keeps_parents() {
    // a: 1 (0.8) -> 2 (0.4); b: 1 (0.4) -> 3 (0.4), 5 (0.2).
    let a = tree(&[7, 1, 2], &[-1, 0, 1], &[1.0, 0.8, 0.4]);
    let b = tree(&[7, 1, 3, 5], &[-1, 0, 1, 0], &[1.0, 0.4, 0.4, 0.2]);
    let m = super::mix(&[(a, 1.0), (b, 3.0)], 8, true);
    let score = |path: &[u32]| {
        (1..m.num_nodes()).find_map(|i| {
            let mut p = vec![m.tokens[i]];
            let mut j = m.parents[i];
            while j > 0 {
                p.insert(0, m.tokens[j as usize]);
                j = m.parents[j as usize];
            }
            (p == path).then_some(m.scores[i])
        })
    };
    let close = |x: Option<f32>, y: f64| (f64::from(x.unwrap()) - y).abs() < 1e-6;
    assert!(close(score(&[1]), (0.8 + 3.0 * 0.4) / 4.0));
    assert!(close(score(&[1, 2]), 0.4 / 4.0));
    assert!(close(score(&[1, 3]), 3.0 * 0.4 / 4.0));
    assert!(close(score(&[5]), 3.0 * 0.2 / 4.0));
    assert_eq!(m.num_nodes(), 5);
    // Cut to 2 nodes: the best two, a parent before its child.
    let m2 = super::mix(
        &[
            (tree(&[7, 1, 2], &[-1, 0, 1], &[1.0, 0.8, 0.4]), 1.0),
            (
                tree(&[7, 1, 3, 5], &[-1, 0, 1, 0], &[1.0, 0.4, 0.4, 0.2]),
                3.0,
            ),
        ],
        2,
        true,
    );
    assert_eq!(
        (m2.tokens.clone(), m2.parents.clone()),
        (vec![7, 1, 3], vec![-1, 0, 1])
    );
    // One branch: the chain of best children.
    let c = super::mix(
        &[
            (tree(&[7, 1, 2], &[-1, 0, 1], &[1.0, 0.8, 0.4]), 1.0),
            (
                tree(&[7, 1, 3, 5], &[-1, 0, 1, 2], &[1.0, 0.4, 0.4, 0.2]),
                3.0,
            ),
        ],
        8,
        false,
    );
    assert_eq!((c.tokens, c.parents), (vec![7, 1, 3, 5], vec![-1, 0, 1, 2]));
}

#[test]
fn prune_drops_foreign_ids_and_deep_nodes_with_their_descendants() {
    //        0 (7)
    //   1 (5)     2 (99: not in a vocabulary of 50)
    //   3 (6)     4 (8, under 2)
    //   5 (9, under 3: depth 3)
    let mut t = tree(
        &[7, 5, 99, 6, 8, 9],
        &[-1, 0, 0, 1, 2, 3],
        &[1.0, 0.9, 0.5, 0.8, 0.4, 0.7],
    );
    t.matched = vec![0, 1, 2, 3, 4, 5];
    let mut all = t.clone();
    all.prune(1 << 32, usize::MAX);
    assert_eq!(all, t); // nothing to drop: unchanged
    t.prune(50, 2);
    assert_eq!(t.tokens, vec![7, 5, 6]);
    assert_eq!(t.parents, vec![-1, 0, 1]);
    assert_eq!(t.scores, vec![1.0, 0.9, 0.8]);
    assert_eq!(t.matched, vec![0, 1, 3]);
    t.prune(50, 0); // no room: the root alone
    assert_eq!((t.tokens, t.parents), (vec![7], vec![-1]));
}
