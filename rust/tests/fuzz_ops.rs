//! A stable-Rust fuzz harness: random operation sequences from several threads at once, for
//! a bounded time, on random configurations (tiny capacities included). It fails on any
//! panic, unexpected error, broken invariant or capacity overrun.
//!
//! `LOOKAHEAD_FUZZ_SECS` (default 3) bounds the run; `LOOKAHEAD_FUZZ_SEED` replays one.
//! CI runs it with the other cargo tests; run longer with
//! `LOOKAHEAD_FUZZ_SECS=600 cargo test --release --test fuzz_ops -- --nocapture`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lookahead_core::{Cache, Config, Error, RequestId};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn tokens(&mut self, max_len: u64, alphabet: u64) -> Vec<u32> {
        let n = self.below(max_len + 1);
        // Mostly a small alphabet (repeats, branching), sometimes huge ids.
        (0..n)
            .map(|_| {
                if self.below(50) == 0 {
                    u32::MAX - self.below(3) as u32
                } else {
                    self.below(alphabet) as u32
                }
            })
            .collect()
    }
}

fn expected(e: &Error) -> bool {
    matches!(
        e,
        Error::UnknownRequest(_) | Error::RequestExists(_) | Error::InvalidInput(_)
    )
}

fn worker(c: &Cache, seed: u64, deadline: Instant, capacity: u64) -> u64 {
    let mut rng = Rng(seed | 1);
    let mut ops = 0;
    let ns = ["default", "a", "b"];
    while Instant::now() < deadline {
        let rid = if rng.below(4) == 0 {
            RequestId::Str(format!("s{}", rng.below(6)))
        } else {
            RequestId::Int(rng.below(12) as i64)
        };
        let r = match rng.below(9) {
            0 | 1 => c.start_request(rid, rng.tokens(200, 8), ns[rng.below(3) as usize]),
            2 => c.extend(&rid, &rng.tokens(6, 8)),
            3 => {
                let toks = rng.tokens(6, 8);
                let k = 1 + rng.below(3) as usize;
                let ids = rng.tokens(0, 8);
                let ids: Vec<u32> = (0..toks.len() * k)
                    .map(|i| ids.get(i).copied().unwrap_or(rng.below(8) as u32))
                    .collect();
                let probs: Vec<f32> = (0..ids.len()).map(|_| rng.below(5) as f32 / 4.0).collect();
                c.extend_predicted(&rid, &toks, &ids, &probs, k)
            }
            4 | 5 => c
                .draft(&rid, 1 + rng.below(40) as usize, rng.below(2) == 0)
                .map(|d| {
                    assert!(d.num_nodes() >= 1);
                    for (i, &p) in d.parents.iter().enumerate().skip(1) {
                        assert!(p >= 0 && (p as usize) < i, "bad parent {p} at {i}");
                    }
                }),
            6 => c.finish_request(&rid, Some(rng.below(2) == 0)),
            7 if rng.below(2) == 0 => {
                c.add_history(&[rng.tokens(300, 8)], ns[rng.below(3) as usize])
            }
            7 => {
                let id = format!("c{}", rng.below(3));
                if rng.below(3) == 0 {
                    c.remove_corpus(&id);
                    Ok(())
                } else {
                    let scope = [None, Some("a")][rng.below(2) as usize];
                    c.begin_corpus(&id, scope).and_then(|mut b| {
                        let doc = rng.tokens(300, 8);
                        b.add_part(&doc, 0..doc.len())?;
                        c.commit_corpus(b).map(|_| ())
                    })
                }
            }
            _ => {
                let rids: Vec<RequestId> = (0..rng.below(5))
                    .map(|i| RequestId::Int(i as i64))
                    .collect();
                c.draft_batch(&rids, 1 + rng.below(16) as usize, true, 2)
                    .map(|_| ())
            }
        };
        if let Err(e) = r {
            assert!(expected(&e), "unexpected error {e:?}");
        }
        c.check_invariants().unwrap();
        let s = c.stats();
        assert!(s.nodes <= capacity);
        if s.capacity_bytes > 0 {
            // The byte budget, plus its stated slack per live request and corpus.
            let slack = (16 << 10) * s.live_requests + (8 << 10) * s.corpora;
            assert!(s.bytes <= s.capacity_bytes + slack, "{s:?}");
        }
        ops += 1;
    }
    ops
}

#[test]
fn fuzz_random_operations_from_threads() {
    let secs: u64 = std::env::var("LOOKAHEAD_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let seed: u64 = std::env::var("LOOKAHEAD_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    eprintln!("fuzz seed {seed} (LOOKAHEAD_FUZZ_SEED={seed} replays the configurations)");
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut rng = Rng(seed | 1);
    let mut rounds = 0;
    let mut total = 0;
    while Instant::now() < deadline {
        let capacity = [1, 7, 64, 500, 5_000, 1 << 20][rng.below(6) as usize];
        let cfg = Config {
            max_depth: 2 + rng.below(14) as usize,
            capacity_nodes: capacity,
            own_weight: [0.0, 0.5, 1.0][rng.below(3) as usize],
            history_weight: [0.25, 1.0][rng.below(2) as usize],
            keep_prompt_as_history: rng.below(2) == 0,
            background_indexing: rng.below(3) != 0,
            index_threads: 1 + rng.below(2) as usize,
            history_skip: [None, Some((3, 6)), Some((1, 2))][rng.below(3) as usize],
            recycle_k: [0, 1, 4][rng.below(3) as usize],
            recycle_slots: [1, 16, 1000][rng.below(3) as usize],
            recycle_weight: [0.5, 1.0][rng.below(2) as usize],
            corpus_weight: [0.5, 2.0][rng.below(2) as usize],
            capacity_bytes: [0, 0, 1 << 20, 4 << 20][rng.below(4) as usize],
        };
        let c = Arc::new(Cache::new(cfg).unwrap());
        let round_end = (Instant::now() + Duration::from_millis(300)).min(deadline);
        let handles: Vec<_> = (0..3)
            .map(|t| {
                let c = Arc::clone(&c);
                let s = rng.next() ^ t;
                std::thread::spawn(move || worker(&c, s, round_end, capacity))
            })
            .collect();
        for h in handles {
            total += h.join().expect("a fuzz worker panicked");
        }
        c.check_invariants().unwrap();
        rounds += 1;
    }
    eprintln!("fuzz: {rounds} configurations, {total} operations");
    assert!(total > 0);
}
