//! Corpora: built aside, drafted from, scoped, cut at their share, removed whole.

use super::*;
use crate::error::Error;

fn cache(cap: u64) -> Cache {
    Cache::new(Config {
        max_depth: 6,
        capacity_nodes: cap,
        background_indexing: false,
        ..Config::default()
    })
    .unwrap()
}

fn add(c: &Cache, id: &str, scope: Option<&str>, docs: &[&[u32]]) -> Result<CorpusInfo, Error> {
    let mut b = c.begin_corpus(id, scope)?;
    for d in docs {
        b.add_part(d, 0..d.len())?;
    }
    c.commit_corpus(b)
}

const MANUAL: &[u32] = &[50, 51, 52, 53, 54, 55, 56, 57];

fn drafted(c: &Cache, rid: i64, prompt: Vec<u32>, ns: &str) -> Vec<u32> {
    let rid = RequestId::Int(rid);
    c.start_request(rid.clone(), prompt, ns).unwrap();
    let d = c.draft(&rid, 4, false).unwrap();
    c.finish_request(&rid, Some(false)).unwrap();
    d.tokens[1..].to_vec()
}

#[test]
fn a_corpus_continues_what_no_request_has_seen() {
    let c = cache(1 << 16);
    assert!(drafted(&c, 1, vec![9, 50, 51], "default").is_empty());
    let info = add(&c, "manual", None, &[MANUAL]).unwrap();
    assert_eq!((info.tokens, info.cut), (MANUAL.len() as u64, false));
    assert_eq!(
        drafted(&c, 2, vec![9, 50, 51], "default"),
        vec![52, 53, 54, 55]
    );
    assert_eq!(
        drafted(&c, 3, vec![9, 50, 51], "tenant"),
        vec![52, 53, 54, 55]
    );
    c.check_invariants().unwrap();
    let s = c.stats();
    assert_eq!((s.corpora, s.nodes), (1, s.corpus_nodes + s.history_nodes));
}

#[test]
fn no_ngram_spans_two_documents() {
    let c = cache(1 << 16);
    add(&c, "docs", None, &[&[1, 2, 3], &[4, 5, 6]]).unwrap();
    // 3 -> 4 would cross the documents' boundary.
    assert!(drafted(&c, 1, vec![9, 2, 3], "default").is_empty());
    assert_eq!(drafted(&c, 2, vec![9, 4], "default"), vec![5, 6]);
}

#[test]
fn a_scoped_corpus_serves_its_namespace_only() {
    let c = cache(1 << 16);
    add(&c, "a-manual", Some("a"), &[MANUAL]).unwrap();
    assert_eq!(drafted(&c, 1, vec![9, 50, 51], "a"), vec![52, 53, 54, 55]);
    assert!(drafted(&c, 2, vec![9, 50, 51], "b").is_empty());
    assert!(drafted(&c, 3, vec![9, 50, 51], "default").is_empty());
}

#[test]
fn removing_a_corpus_drops_it_whole() {
    let c = cache(1 << 16);
    add(&c, "manual", None, &[MANUAL]).unwrap();
    assert!(c.stats().corpus_nodes > 0);
    assert!(c.remove_corpus("manual"));
    assert!(!c.remove_corpus("manual"));
    assert!(drafted(&c, 1, vec![9, 50, 51], "default").is_empty());
    let s = c.stats();
    assert_eq!(
        (s.corpora, s.corpus_nodes, s.nodes),
        (0, 0, s.history_nodes)
    );
    c.check_invariants().unwrap();
    // The id is free again.
    add(&c, "manual", None, &[MANUAL]).unwrap();
}

#[test]
fn bad_ids_duplicates_and_concurrent_builds_are_refused() {
    let c = cache(1 << 16);
    add(&c, "x", None, &[MANUAL]).unwrap();
    assert!(
        matches!(add(&c, "x", None, &[MANUAL]), Err(Error::InvalidInput(m)) if m.contains("exists"))
    );
    assert!(matches!(
        add(&c, "", None, &[MANUAL]),
        Err(Error::InvalidInput(_))
    ));
    let b = c.begin_corpus("y", None).unwrap();
    assert!(
        matches!(c.begin_corpus("z", None), Err(Error::InvalidInput(m)) if m.contains("one at a time"))
    );
    drop(b); // unpublished: nothing kept, and the next build may start
    assert!(!building(&c));
    assert_eq!(c.corpora().len(), 1);
    c.check_invariants().unwrap();
    add(&c, "z", None, &[MANUAL]).unwrap();
}

#[test]
fn corpora_are_cut_at_their_share_of_the_capacity() {
    let cap = 2_000;
    let c = cache(cap);
    // Some history first: a corpus may evict it, never past the corpora's share.
    c.add_history(&[(0..400u32).map(|i| i % 97).collect()], "default")
        .unwrap();
    let big: Vec<u32> = (0..5_000u32).map(|i| (i * 7919) % 3001).collect();
    let info = add(&c, "big", None, &[&big]).unwrap();
    assert!(info.cut, "{info:?}");
    assert!(info.tokens < big.len() as u64);
    assert!(info.nodes <= cap / CORPUS_SHARE, "{info:?}");
    c.check_invariants().unwrap();
    assert!(c.stats().nodes <= cap);
    // The share is spent: the next corpus gets nothing, and says so.
    let next = add(&c, "next", None, &[&[3001, 3002, 3003]]).unwrap();
    assert!(next.cut && next.tokens == 0, "{next:?}");
}

#[test]
fn a_corpus_draft_mixes_with_the_request_own() {
    let c = cache(1 << 16);
    add(&c, "manual", None, &[&[1, 2, 70, 71]]).unwrap();
    let rid = RequestId::Int(1);
    // The request's own text continues 1 2 with 3; the corpus with 70.
    c.start_request(rid.clone(), vec![1, 2, 3, 4, 1, 2], "default")
        .unwrap();
    let d = c.draft(&rid, 8, true).unwrap();
    let children: Vec<u32> = (1..d.num_nodes())
        .filter(|&i| d.parents[i] == 0)
        .map(|i| d.tokens[i])
        .collect();
    assert!(children.contains(&3) && children.contains(&70), "{d:?}");
    for i in 1..d.num_nodes() {
        let p = d.parents[i] as usize;
        assert!(p < i && d.scores[i] <= d.scores[p], "{d:?}");
    }
}

#[test]
fn corpora_move_to_a_fresh_cache() {
    let c = cache(1 << 16);
    add(&c, "manual", None, &[MANUAL]).unwrap();
    let fresh = cache(1 << 16);
    assert_eq!(c.move_corpora_to(&fresh), vec!["manual".to_string()]);
    assert!(c.corpora().is_empty());
    c.check_invariants().unwrap();
    fresh.check_invariants().unwrap();
    assert_eq!(c.stats().corpus_nodes, 0);
    assert_eq!(
        drafted(&fresh, 1, vec![9, 50, 51], "default"),
        vec![52, 53, 54, 55]
    );
    // No room in the target: it stays.
    let tiny = cache(3);
    assert!(fresh.move_corpora_to(&tiny).is_empty());
    assert_eq!(fresh.corpora().len(), 1);
}
