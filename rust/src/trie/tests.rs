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
