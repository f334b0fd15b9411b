use super::locks::{read, write};
use super::namespace::COMPACT_SLACK;
use super::*;
use crate::error::Error;
use std::collections::HashMap as Map;

fn cfg(depth: usize, cap: u64, bg: bool) -> Config {
    Config {
        max_depth: depth,
        capacity_nodes: cap,
        background_indexing: bg,
        ..Config::default()
    }
}

fn naive_outputs(prompt: &[u32], outs: &[u32], depth: usize) -> Map<Vec<u32>, u32> {
    let ctx: Vec<u32> = prompt.iter().chain(outs).copied().collect();
    let mut m = Map::new();
    for j in prompt.len()..ctx.len() {
        for s in (j + 1).saturating_sub(depth)..=j {
            *m.entry(ctx[s..=j].to_vec()).or_insert(0) += 1;
        }
    }
    m
}

#[test]
fn extend_counts_equal_naive_recount() {
    let c = Cache::new(cfg(4, 1 << 20, false)).unwrap();
    let prompt = vec![1, 2, 3, 1, 2];
    let outs: Vec<u32> = vec![3, 1, 2, 4, 1, 2, 3, 3, 3];
    let rid = RequestId::Int(1);
    c.start_request(rid.clone(), prompt.clone(), "default")
        .unwrap();
    for part in outs.chunks(2) {
        c.extend(&rid, part).unwrap();
        c.check_invariants().unwrap();
    }
    let ns = c.namespaces()[0].clone();
    let h = ns.history.read().unwrap();
    let got: Map<Vec<u32>, u32> = h.ngrams().into_iter().filter(|(_, n)| *n > 0).collect();
    assert_eq!(got, naive_outputs(&prompt, &outs, 4));
}

#[test]
fn outputs_before_the_prompt_is_indexed_are_counted_once_it_is() {
    let c = Cache::new(Config {
        index_threads: 1,
        ..cfg(4, 1 << 26, true)
    })
    .unwrap();
    // The one indexing thread is busy with a long prompt, so request 2's waits.
    let long: Vec<u32> = (0..400_000u32)
        .map(|i| i.wrapping_mul(2_654_435_761) % 5000)
        .collect();
    c.start_request(RequestId::Int(1), long, "default").unwrap();
    let prompt = vec![1, 2, 3, 1, 2];
    let outs: Vec<u32> = vec![3, 1, 2, 4, 1, 2, 3, 3, 3];
    let rid = RequestId::Int(2);
    c.start_request(rid.clone(), prompt.clone(), "default")
        .unwrap();
    assert!(c.stats().pending_prompts >= 1);
    c.extend(&rid, &outs[..4]).unwrap();
    c.draft(&rid, 4, true).unwrap();
    c.extend(&rid, &outs[4..]).unwrap();
    let got: Map<Vec<u32>, u32> = c
        .own_ngrams(&rid)
        .unwrap()
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .collect();
    let all: Vec<u32> = prompt.iter().chain(&outs).copied().collect();
    assert_eq!(got, naive_outputs(&[], &all, 4));
    c.finish_request(&RequestId::Int(1), None).unwrap();
    c.check_invariants().unwrap();
}

#[test]
fn own_output_nodes_stay_under_half_the_capacity() {
    let cap = 4_000;
    let c = Cache::new(cfg(4, cap, false)).unwrap();
    let rid = RequestId::Int(1);
    c.start_request(rid.clone(), vec![1, 2, 3], "default")
        .unwrap();
    let own_nodes = c.stats().own_nodes;
    // Novel text: every token brings new n-grams to both tries.
    for i in 0..3_000u32 {
        c.extend(&rid, &[i.wrapping_mul(2_654_435_761) % 100_000])
            .unwrap();
    }
    c.check_invariants().unwrap();
    let s = c.stats();
    // The check runs before each chunk, so one chunk (here 1 token: <= 4 + 16 nodes) may
    // pass the line.
    assert!(s.own_nodes <= cap / 2 + own_nodes + 20, "{s:?}");
    assert!(s.history_nodes > 0 && s.nodes <= cap, "{s:?}");
    assert!(c.budget().own_outputs() >= cap / 2);
    c.finish_request(&rid, None).unwrap();
    assert_eq!(c.budget().own_outputs(), 0);
    assert_eq!(c.budget().used(), c.stats().history_nodes);
}

#[test]
fn errors_for_unknown_and_reused_ids() {
    let c = Cache::new(cfg(4, 1000, true)).unwrap();
    let a = RequestId::Str("a".into());
    c.start_request(a.clone(), vec![1], "default").unwrap();
    assert_eq!(
        c.start_request(a.clone(), vec![1], "default")
            .unwrap_err()
            .kind(),
        "RequestExists"
    );
    c.finish_request(&a, None).unwrap();
    assert_eq!(c.extend(&a, &[1]).unwrap_err().kind(), "UnknownRequest");
    assert_eq!(c.draft(&a, 4, true).unwrap_err().kind(), "UnknownRequest");
    assert_eq!(
        c.finish_request(&a, None).unwrap_err().kind(),
        "UnknownRequest"
    );
    assert_eq!(
        c.start_request(a, vec![], "default").unwrap_err().kind(),
        "InvalidInput"
    );
    assert!(Cache::new(cfg(1, 10, true)).is_err());
}

#[test]
fn a_noisy_namespace_leaves_the_others_their_share() {
    let cap = 20_000u64;
    let c = Cache::new(cfg(12, cap, false)).unwrap();
    let mut x = 7u32;
    let mut rand = |m: u32| {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        x % m
    };
    for q in 0..4 {
        let t: Vec<u32> = (0..150).map(|_| rand(500)).collect();
        c.add_history(&[t], &format!("quiet-{q}")).unwrap();
    }
    let quiet: Vec<_> = (0..4)
        .map(|q| c.history_ngrams(&format!("quiet-{q}")).len())
        .collect();
    for _ in 0..60 {
        let t: Vec<u32> = (0..2000).map(|_| rand(32_000)).collect();
        c.add_history(&[t], "noisy").unwrap();
        assert!(c.stats().nodes <= cap);
    }
    // Together the quiet ones hold less than half the capacity, so the noisy one, past
    // its half, evicts only its own history: the quiet ones keep every n-gram.
    assert!(quiet.iter().sum::<usize>() < (cap / NAMESPACE_SHARE) as usize);
    assert!(c.history_ngrams("noisy").len() > (cap / NAMESPACE_SHARE) as usize);
    for (q, &n) in quiet.iter().enumerate() {
        assert_eq!(c.history_ngrams(&format!("quiet-{q}")).len(), n);
    }
    c.check_invariants().unwrap();
}

#[test]
fn eviction_looks_at_a_bounded_number_of_namespaces() {
    // 3,000 namespaces with a few nodes each, then one that needs room over and over:
    // every eviction frees what it needs from the ring's front, never sweeping them all.
    let c = Cache::new(cfg(4, 20_000, false)).unwrap();
    for i in 0..3000u32 {
        c.add_history(&[vec![i, i + 1, i + 2]], &format!("t{i}"))
            .unwrap();
    }
    // 6 nodes each; the empty "default" went when the first came.
    assert_eq!((c.stats().namespaces, c.stats().nodes), (3000, 18_000));
    let t: Vec<u32> = (0..20_000u32).map(|i| i * 7 % 9973).collect();
    c.add_history(&[t], "big").unwrap();
    let s = c.stats();
    assert!(s.nodes <= 20_000);
    // Tenants went whole, as many as "big" needed before it reached its share; every
    // other one is untouched (no sweep passed over it: a pass halves each count).
    let mut gone = 0;
    for i in 0..3000 {
        let g = c.history_ngrams(&format!("t{i}"));
        if g.is_empty() {
            gone += 1;
        } else {
            assert!(
                g.len() == 6 && g.iter().all(|(_, n)| *n == 1),
                "t{i}: {g:?}"
            );
        }
    }
    assert!(gone > 0 && gone <= 2000, "{gone}");
    assert_eq!(s.namespaces, 3001 - gone);
    c.check_invariants().unwrap();
}

#[test]
fn history_in_parts_counts_what_the_whole_text_does() {
    let text: Vec<u32> = (0..1000u32).map(|i| (i * 13 + i / 9) % 41).collect();
    let (a, b) = (
        Cache::new(cfg(6, 1 << 20, false)).unwrap(),
        Cache::new(cfg(6, 1 << 20, false)).unwrap(),
    );
    a.add_history(std::slice::from_ref(&text), "x").unwrap();
    for s in (0..text.len()).step_by(77) {
        b.add_history_part(&text, s..(s + 77).min(text.len()), "x")
            .unwrap();
    }
    let (mut x, mut y) = (a.history_ngrams("x"), b.history_ngrams("x"));
    x.sort();
    y.sort();
    assert_eq!(x, y);
    assert!(b.add_history_part(&text, 5..2000, "x").is_err());
}

#[test]
fn namespaces_do_not_share_outputs() {
    let c = Cache::new(cfg(4, 1 << 20, false)).unwrap();
    c.add_history(&[vec![7, 8, 9]], "a").unwrap();
    let x = RequestId::Int(1);
    let y = RequestId::Int(2);
    c.start_request(x.clone(), vec![7], "a").unwrap();
    c.start_request(y.clone(), vec![7], "b").unwrap();
    assert_eq!(c.draft(&x, 4, false).unwrap().tokens, vec![7, 8, 9]);
    assert_eq!(c.draft(&y, 4, false).unwrap().tokens, vec![7]);
    let s = c.stats();
    // "a" and "b"; the empty, unused "default" was dropped when they came.
    assert_eq!((s.hits, s.misses, s.namespaces), (1, 1, 2));
}

#[test]
fn capacity_holds_with_a_huge_prompt_and_history() {
    let c = Cache::new(cfg(6, 500, true)).unwrap();
    let text: Vec<u32> = (0..3000u32).map(|i| (i * 31) % 97).collect();
    c.add_history(std::slice::from_ref(&text), "default")
        .unwrap();
    assert!(c.stats().nodes <= 500);
    c.start_request(RequestId::Int(1), text.clone(), "default")
        .unwrap();
    c.draft(&RequestId::Int(1), 8, true).unwrap();
    let s = c.stats();
    assert!(s.nodes <= 500, "{s:?}");
    assert_eq!(s.truncated_prompts, 1);
    c.extend(&RequestId::Int(1), &text[..200]).unwrap();
    c.check_invariants().unwrap();
    c.finish_request(&RequestId::Int(1), Some(true)).unwrap();
    c.check_invariants().unwrap();
    assert!(c.stats().nodes <= 500);
    assert_eq!(c.stats().own_nodes, 0);
}

#[test]
fn finishing_releases_the_prompt() {
    let c = Cache::new(cfg(4, 10_000, true)).unwrap();
    let r = RequestId::Int(3);
    c.start_request(r.clone(), (0..100).collect(), "default")
        .unwrap();
    c.draft(&r, 2, true).unwrap();
    assert!(c.stats().own_nodes > 0);
    c.finish_request(&r, None).unwrap();
    c.check_invariants().unwrap();
    assert_eq!(c.stats().nodes, 0);
    assert_eq!(c.budget().used(), 0);
}

fn recycling(k: usize, slots: usize) -> Cache {
    Cache::new(Config {
        recycle_k: k,
        recycle_slots: slots,
        ..cfg(4, 1 << 20, false)
    })
    .unwrap()
}

#[test]
fn recycled_predictions_draft_what_no_trie_holds() {
    let rid = RequestId::Int(1);
    let run = |c: &Cache| {
        c.start_request(rid.clone(), vec![100, 101], "default")
            .unwrap();
        // The target chose 7 after 101 (8 its second guess), then 9 after 7.
        c.extend_predicted(&rid, &[7, 9], &[7, 8, 9, 3], &[0.75, 0.25, 0.5, 0.5], 2)
            .unwrap();
        c.extend(&rid, &[5, 101]).unwrap();
        c.draft(&rid, 4, true).unwrap()
    };
    let c = recycling(4, 64);
    let d = run(&c);
    // 8 never followed 101 in any text: only the recycled row after 101 offers it.
    assert!(d.tokens[1..].contains(&8), "{d:?}");
    assert!(d.tokens[1..].contains(&7), "{d:?}");
    c.check_invariants().unwrap();
    // Two keys per row (the token alone, and after the one before it).
    assert_eq!(c.stats().recycled_keys, 4);
    let off = recycling(0, 64);
    let d = run(&off);
    assert_eq!(off.stats().recycled_keys, 0);
    assert!(!d.tokens[1..].contains(&8), "{d:?}");
}

#[test]
fn recycled_rows_are_checked_and_kept_apart_by_namespace() {
    // Weight 1: the row's 0.9 outranks the trie's once-seen 3 (1/2).
    let c = Cache::new(Config {
        recycle_k: 2,
        recycle_slots: 16,
        recycle_weight: 1.0,
        ..cfg(4, 1 << 20, false)
    })
    .unwrap();
    let a = RequestId::Int(1);
    let b = RequestId::Int(2);
    c.start_request(a.clone(), vec![1, 2], "x").unwrap();
    c.start_request(b.clone(), vec![1, 2], "y").unwrap();
    for bad in [
        c.extend_predicted(&a, &[3], &[4], &[0.5, 0.5], 1),
        c.extend_predicted(&a, &[3], &[4, 5], &[0.5, 1.5], 2),
        c.extend_predicted(&a, &[3], &[], &[], 0),
        c.extend_predicted(&a, &[3], &[4], &[f32::NAN], 1),
        // 2 * 2**63 wraps to 0 rows: refused before the context is extended
        c.extend_predicted(&a, &[3, 3], &[], &[], 1 << 63),
    ] {
        assert!(matches!(bad, Err(Error::InvalidInput(_))), "{bad:?}");
    }
    // The row after token 2 (the one before the new token 3).
    c.extend_predicted(&a, &[3], &[4], &[0.9], 1).unwrap();
    c.extend(&a, &[9, 2]).unwrap();
    c.extend(&b, &[3, 9, 2]).unwrap();
    let da = c.draft(&a, 4, false).unwrap();
    let db = c.draft(&b, 4, false).unwrap();
    assert_eq!(da.tokens[1], 4, "{da:?}");
    assert!(!db.tokens.contains(&4), "{db:?}");
    c.check_invariants().unwrap();
}

#[test]
fn a_recycled_token_is_continued_from_its_own_path() {
    // After 101 the text says 7; the target's row after 101 says 7 or 8, and 8 occurs in
    // the text only as "8 60 61". Node 8 (no trie continues "101 8") is matched afresh on
    // context + path: its child is 60, not what follows the context's own suffix (7).
    let c = recycling(2, 64);
    let rid = RequestId::Int(1);
    c.start_request(rid.clone(), vec![100, 101, 7, 9, 8, 60, 61, 5], "default")
        .unwrap();
    c.extend_predicted(&rid, &[101, 7], &[101, 3, 7, 8], &[0.9, 0.05, 0.5, 0.45], 2)
        .unwrap();
    c.extend(&rid, &[5, 101]).unwrap();
    let d = c.draft(&rid, 8, true).unwrap();
    let eight = (1..d.num_nodes())
        .find(|&i| d.tokens[i] == 8 && d.parents[i] == 0)
        .unwrap_or_else(|| panic!("no recycled 8 under the root: {d:?}"));
    let kids: Vec<u32> = (1..d.num_nodes())
        .filter(|&i| d.parents[i] == eight as i32)
        .map(|i| d.tokens[i])
        .collect();
    assert_eq!(kids.first(), Some(&60), "{d:?}");
}

/// The same steps on two caches, the first with its history held (as a compaction or a save
/// holds it) during `held` of them: each held step must finish without waiting, and once
/// the hold ends the histories must be the same.
fn steps_beside_a_hold(held: std::ops::Range<usize>, finish_while_held: bool) {
    use std::sync::mpsc;
    use std::time::Duration;
    let text: Vec<u32> = (0..2000u32).map(|i| (i * 7 + i / 11) % 37).collect();
    let outs: Vec<u32> = (0..40u32).map(|i| (i * 5) % 37).collect();
    let (a, b) = (
        Cache::new(cfg(5, 1 << 20, true)).unwrap(),
        Cache::new(cfg(5, 1 << 20, false)).unwrap(),
    );
    let rid = RequestId::Int(1);
    for c in [&a, &b] {
        c.add_history(std::slice::from_ref(&text), "x").unwrap();
        c.start_request(rid.clone(), vec![3, 1, 4], "x").unwrap();
    }
    let ns = a.namespaces()[0].clone();
    let run = |c: &Cache, i: usize| c.step(&rid, &outs[i * 2..i * 2 + 2], 8, true).unwrap();
    for i in 0..held.start {
        assert_eq!(run(&a, i), run(&b, i));
    }
    std::thread::scope(|s| {
        // Inside the scope: if an assertion fails, the hold ends as the closure unwinds,
        // so the scope can join a step that did wait.
        let hold = ns.hold_long();
        let frozen = read(&ns.history);
        let before = frozen.ngrams();
        let (tx, rx) = mpsc::channel();
        let (a, held2, rid2) = (&a, held.clone(), rid.clone());
        s.spawn(move || {
            for i in held2 {
                run(a, i);
                tx.send(()).unwrap();
            }
            if finish_while_held {
                a.finish_request(&rid2, Some(true)).unwrap();
                tx.send(()).unwrap();
            }
        });
        for i in held.clone() {
            let got = rx.recv_timeout(Duration::from_secs(30));
            assert!(got.is_ok(), "step {i} waited for the hold");
            b.step(&rid, &outs[i * 2..i * 2 + 2], 8, true).unwrap();
        }
        if finish_while_held {
            assert!(
                rx.recv_timeout(Duration::from_secs(30)).is_ok(),
                "finish waited"
            );
        }
        assert_eq!(
            frozen.ngrams(),
            before,
            "the history was written under the hold"
        );
        drop(frozen);
        drop(hold);
    });
    if finish_while_held {
        b.finish_request(&rid, Some(true)).unwrap();
        wait_idle(&a);
    } else {
        for i in held.end..outs.len() / 2 {
            assert_eq!(run(&a, i), run(&b, i), "step {i}");
        }
    }
    a.check_invariants().unwrap();
    let (mut x, mut y) = (a.history_ngrams("x"), b.history_ngrams("x"));
    x.sort();
    y.sort();
    assert_eq!(x, y);
}

#[test]
fn steps_go_on_while_a_compaction_or_a_save_holds_the_history() {
    steps_beside_a_hold(3..9, false);
}

#[test]
fn finishing_while_the_history_is_held_counts_what_was_left() {
    steps_beside_a_hold(2..5, true);
}

#[test]
fn compacting_a_shrunk_history_keeps_its_ngrams() {
    let c = Cache::new(cfg(5, 1 << 20, false)).unwrap();
    let text: Vec<u32> = (0..5000u32).map(|i| (i * 7 + i / 13) % 101).collect();
    c.add_history(std::slice::from_ref(&text), "x").unwrap();
    let ns = c.namespaces()[0].clone();
    let nodes = read(&ns.history).nodes();
    // Sweep without compacting, until most slots are free.
    while read(&ns.history).free_slots() <= nodes / 2 + COMPACT_SLACK {
        let f = write(&ns.history).sweep(1 << 16, nodes);
        c.budget().release(f);
    }
    let (mut want, epoch) = (c.history_ngrams("x"), read(&ns.history).epoch);
    assert!(ns.compact_history());
    assert_eq!(read(&ns.history).free_slots(), 0);
    assert!(
        read(&ns.history).epoch > epoch,
        "cursors into the old arena must go stale"
    );
    assert!(!ns.compact_history(), "nothing left to compact");
    let mut got = c.history_ngrams("x");
    want.sort();
    got.sort();
    assert_eq!(got, want);
    c.check_invariants().unwrap();
}

/// Waits (at most 30 s) until no job of `c` is in flight.
fn wait_idle(c: &Cache) {
    let t0 = std::time::Instant::now();
    while c
        .shared
        .in_flight
        .load(std::sync::atomic::Ordering::Acquire)
        > 0
    {
        assert!(t0.elapsed().as_secs() < 30, "jobs still in flight");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

#[test]
fn a_byte_budget_bounds_nodes_and_namespaces_by_the_worst_case() {
    use super::config::{HOLDER_SHARE, WORST_BYTES_PER_HOLDER, WORST_BYTES_PER_NODE};
    let bytes = 4u64 << 20;
    let c = Cache::new(Config {
        capacity_bytes: bytes,
        ..cfg(4, 1 << 30, false)
    })
    .unwrap();
    let nodes = (bytes - bytes / HOLDER_SHARE) / WORST_BYTES_PER_NODE;
    let max_ns = bytes / HOLDER_SHARE / WORST_BYTES_PER_HOLDER;
    let s = c.stats();
    assert_eq!((s.capacity_nodes, s.capacity_bytes), (nodes, bytes));
    // Many tenants, each a little history: namespaces past the share go whole, oldest first.
    for t in 0..3 * max_ns {
        let text: Vec<u32> = (0..50).map(|i| (i * 7 + t as u32) % 97).collect();
        c.add_history(&[text], &format!("tenant-{t}")).unwrap();
        let s = c.stats();
        assert!(
            s.namespaces <= max_ns,
            "{} namespaces > {max_ns}",
            s.namespaces
        );
        assert!(s.bytes <= bytes, "{} bytes > {bytes}", s.bytes);
        c.check_invariants().unwrap();
    }
    assert!(c.stats().evicted_nodes > 0);
    // The newest tenants are the ones kept.
    let kept = c.namespaces();
    assert!(kept
        .iter()
        .any(|n| n.name == format!("tenant-{}", 3 * max_ns - 1)));
    assert!(!kept.iter().any(|n| n.name == "tenant-0"));
}

#[test]
fn a_byte_budget_is_checked() {
    for (bytes, ok) in [
        (0, true),
        (1, false),
        ((1 << 20) - 1, false),
        (1 << 20, true),
    ] {
        let r = Cache::new(Config {
            capacity_bytes: bytes,
            ..Config::default()
        });
        assert_eq!(r.is_ok(), ok, "{bytes}");
    }
    // Recycled predictions take their bytes first: too little left for nodes is refused.
    let r = Cache::new(Config {
        capacity_bytes: 16 << 20,
        recycle_k: 8,
        ..Config::default()
    });
    let Err(Error::InvalidInput(m)) = r else {
        panic!("accepted")
    };
    assert!(m.contains("recycle_slots"), "{m}");
}
