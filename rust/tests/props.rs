//! Property tests over random operation sequences (proptest):
//! - counts in every trie equal a naive recount of the indexed text (nothing evicted);
//! - every draft node continues a suffix of context + path that occurs in the indexed text;
//! - the structure is sound and `nodes <= capacity` after every operation, at any capacity.

use std::collections::{HashMap, HashSet};

use lookahead_core::{Cache, Config, RequestId};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Start(u8, Vec<u32>, u8),
    Extend(u8, Vec<u32>),
    Finish(u8, bool),
    History(Vec<u32>, u8),
    Draft(u8, usize, bool),
}

fn text(max: usize) -> impl Strategy<Value = Vec<u32>> {
    prop::collection::vec(0u32..4, 1..max)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..4, text(30), 0u8..2).prop_map(|(r, t, n)| Op::Start(r, t, n)),
        (0u8..4, text(8)).prop_map(|(r, t)| Op::Extend(r, t)),
        (0u8..4, any::<bool>()).prop_map(|(r, k)| Op::Finish(r, k)),
        (text(40), 0u8..2).prop_map(|(t, n)| Op::History(t, n)),
        (0u8..4, 1usize..16, any::<bool>()).prop_map(|(r, b, m)| Op::Draft(r, b, m)),
    ]
}

const NS: [&str; 2] = ["default", "other"];

/// The naive model: indexed n-grams per namespace history and per live prompt.
#[derive(Default)]
struct Model {
    history: HashMap<&'static str, HashMap<Vec<u32>, u32>>,
    live: HashMap<u8, (Vec<u32>, Vec<u32>, &'static str)>, // prompt, context, namespace
}

fn count_ending_at(
    m: &mut HashMap<Vec<u32>, u32>,
    text: &[u32],
    depth: usize,
    ends: std::ops::Range<usize>,
) {
    for j in ends {
        for s in (j + 1).saturating_sub(depth)..=j {
            *m.entry(text[s..=j].to_vec()).or_insert(0) += 1;
        }
    }
}

fn positive(v: Vec<(Vec<u32>, u32)>) -> HashMap<Vec<u32>, u32> {
    v.into_iter().filter(|(_, c)| *c > 0).collect()
}

fn apply(c: &Cache, m: &mut Model, op: &Op, depth: usize) {
    match op {
        Op::Start(r, t, n) if !m.live.contains_key(r) => {
            c.start_request(RequestId::Int(i64::from(*r)), t.clone(), NS[*n as usize])
                .unwrap();
            m.live.insert(*r, (t.clone(), t.clone(), NS[*n as usize]));
        }
        Op::Extend(r, t) if m.live.contains_key(r) => {
            c.extend(&RequestId::Int(i64::from(*r)), t).unwrap();
            let (_, ctx, ns) = m.live.get_mut(r).unwrap();
            let start = ctx.len();
            ctx.extend_from_slice(t);
            count_ending_at(
                m.history.entry(ns).or_default(),
                ctx,
                depth,
                start..ctx.len(),
            );
        }
        Op::Finish(r, keep) if m.live.contains_key(r) => {
            c.finish_request(&RequestId::Int(i64::from(*r)), Some(*keep))
                .unwrap();
            let (prompt, _, ns) = m.live.remove(r).unwrap();
            if *keep {
                count_ending_at(
                    m.history.entry(ns).or_default(),
                    &prompt,
                    depth,
                    0..prompt.len(),
                );
            }
        }
        Op::History(t, n) => {
            c.add_history(std::slice::from_ref(t), NS[*n as usize])
                .unwrap();
            count_ending_at(
                m.history.entry(NS[*n as usize]).or_default(),
                t,
                depth,
                0..t.len(),
            );
        }
        _ => {}
    }
}

fn cache(depth: usize, capacity: u64, background: bool) -> Cache {
    Cache::new(Config {
        max_depth: depth,
        capacity_nodes: capacity,
        background_indexing: background,
        index_threads: 1,
        ..Config::default()
    })
    .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn counts_equal_naive_recount(
        depth in 2usize..6,
        background in any::<bool>(),
        ops in prop::collection::vec(op(), 0..30),
    ) {
        // In the background, outputs may arrive before their request's trie is built.
        let c = cache(depth, 1 << 30, background);
        let mut m = Model::default();
        for o in &ops {
            apply(&c, &mut m, o, depth);
            // A draft may be the call that counts outputs buffered during a background build.
            if let Op::Draft(r, budget, multi) = o {
                if m.live.contains_key(r) {
                    c.draft(&RequestId::Int(i64::from(*r)), *budget, *multi).unwrap();
                }
            }
        }
        for r in m.live.keys() {
            c.draft(&RequestId::Int(i64::from(*r)), 1, false).unwrap();
        }
        c.check_invariants().unwrap();
        for ns in NS {
            let want = m.history.get(ns).cloned().unwrap_or_default();
            prop_assert_eq!(positive(c.history_ngrams(ns)), want, "namespace {}", ns);
        }
        for (r, (_, ctx, _)) in &m.live {
            // The request's own trie: its prompt and its outputs so far.
            let mut want = HashMap::new();
            count_ending_at(&mut want, ctx, depth, 0..ctx.len());
            let got = positive(c.own_ngrams(&RequestId::Int(i64::from(*r))).unwrap());
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn draft_nodes_continue_indexed_text(depth in 2usize..6, ops in prop::collection::vec(op(), 0..30)) {
        let c = cache(depth, 1 << 30, true);
        let mut m = Model::default();
        for o in &ops {
            apply(&c, &mut m, o, depth);
            let Op::Draft(r, budget, multi) = o else { continue };
            let Some((prompt, ctx, ns)) = m.live.get(r) else { continue };
            let d = c.draft(&RequestId::Int(i64::from(*r)), *budget, *multi).unwrap();
            prop_assert_eq!(d.tokens[0], *ctx.last().unwrap());
            prop_assert!(d.num_nodes() <= budget + 1);
            let mut known: HashSet<Vec<u32>> = m.history.get(ns).map(|h| h.keys().cloned().collect()).unwrap_or_default();
            let mut pm = HashMap::new();
            count_ending_at(&mut pm, prompt, depth, 0..prompt.len());
            known.extend(pm.into_keys());
            for i in 1..d.num_nodes() {
                let p = d.parents[i];
                prop_assert!(p >= 0 && (p as usize) < i);
                // context + path to the parent, then this node's token
                let mut path = vec![d.tokens[i]];
                let mut j = p as usize;
                while j != 0 {
                    path.push(d.tokens[j]);
                    j = d.parents[j] as usize;
                }
                path.reverse();
                let mut full = ctx.clone();
                full.extend_from_slice(&path);
                let ok = (2..=depth.min(full.len())).any(|k| known.contains(&full[full.len() - k..]));
                prop_assert!(ok, "node {} of {:?} continues nothing indexed", i, d);
            }
        }
    }

    #[test]
    fn capacity_and_structure_hold_under_eviction(
        depth in 2usize..8,
        capacity in 1u64..400,
        ops in prop::collection::vec(op(), 0..40),
    ) {
        let c = cache(depth, capacity, true);
        let mut m = Model::default();
        for o in &ops {
            apply(&c, &mut m, o, depth);
            if let Op::Draft(r, budget, multi) = o {
                if m.live.contains_key(r) {
                    let d = c.draft(&RequestId::Int(i64::from(*r)), *budget, *multi).unwrap();
                    prop_assert!(d.num_nodes() <= budget + 1);
                }
            }
            c.check_invariants().unwrap();
            prop_assert!(c.stats().nodes <= capacity);
        }
    }
}
