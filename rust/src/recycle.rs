//! Recycled predictions: the target model's own top-k next tokens from earlier verify steps.
//!
//! Every verify forward computes the target's distribution after each verified token; the
//! engine hands the top-k of those distributions to `extend`, and this table keeps them keyed
//! by the token they followed and by that token with the one before it (after Token
//! Recycling, Luo et al. 2024, which keeps each token's top-k successors in an adjacency
//! table). A draft looks up the pair first, then the token alone, and offers the entries as
//! children of the tree node they follow, beside the tries' continuations (`draft/grow.rs`).
//!
//! Memory is bounded by a fixed number of slots (rows of `width` entries) shared by every
//! namespace; a write always takes the slot after the last written one, dropping the entry
//! that held it, so what goes first is what was written longest ago (newest evidence wins:
//! a key written again moves to the new slot, its old slot becomes a hole).

use rustc_hash::FxHashMap;

/// Largest row width (`recycle_k`) accepted.
pub const MAX_WIDTH: usize = 64;
/// `prev` of a key that holds the token alone (no token id is this large in practice, and
/// a pair with it as `prev` only shares a row with that token's own entry).
pub const ALONE: u32 = u32::MAX;

/// (namespace id, previous token or `ALONE`, token).
pub type Key = (u64, u32, u32);

/// The table of recycled predictions.
pub struct Recycled {
    width: usize,
    slots: usize,
    map: FxHashMap<Key, u32>,
    /// Per slot: the key it holds (`None`: empty or a hole).
    owner: Vec<Option<Key>>,
    /// `slots * width` token ids and probabilities; a row's unused tail has probability 0.
    ids: Vec<u32>,
    probs: Vec<f32>,
    /// The slot the next write takes.
    head: usize,
}

impl Recycled {
    /// A table of `slots` rows of `width` entries (`width == 0` or `slots == 0`: keeps
    /// nothing). Memory is allocated as rows are first written.
    pub fn new(width: usize, slots: usize) -> Self {
        Recycled {
            width: width.min(MAX_WIDTH),
            slots: if width == 0 { 0 } else { slots },
            map: FxHashMap::default(),
            owner: Vec::new(),
            ids: Vec::new(),
            probs: Vec::new(),
            head: 0,
        }
    }

    pub fn enabled(&self) -> bool {
        self.slots > 0
    }

    /// Live entries.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Bytes held: rows, owners and the map's table (hashbrown: a power of two of buckets,
    /// at least 8/7 of its capacity, each an entry and a control byte).
    pub fn bytes(&self) -> usize {
        let cap = self.map.capacity();
        let buckets = if cap == 0 {
            0
        } else {
            (cap * 8 / 7).next_power_of_two()
        };
        self.ids.capacity() * 4
            + self.probs.capacity() * 4
            + self.owner.capacity() * std::mem::size_of::<Option<Key>>()
            + buckets * (std::mem::size_of::<(Key, u32)>() + 1)
    }

    /// Stores `row` (token, probability) under `key`, best `width` first (probability desc,
    /// token asc); entries with probability <= 0 or not finite are dropped, a token given
    /// twice keeps its higher probability, and a row left empty is not stored.
    pub fn put(&mut self, key: Key, row: &[(u32, f32)]) {
        if self.slots == 0 {
            return;
        }
        let mut best = [(0u32, 0f32); MAX_WIDTH];
        let mut n = 0;
        for &(t, p) in row {
            if !(p.is_finite() && p > 0.0) {
                continue;
            }
            let p = p.min(1.0);
            if let Some(seen) = best[..n].iter_mut().find(|e| e.0 == t) {
                // A token given twice is one sibling: its higher probability counts.
                seen.1 = seen.1.max(p);
                continue;
            }
            if n < self.width {
                best[n] = (t, p);
                n += 1;
            } else {
                // More than `width` given: replace the worst kept if this one is better.
                let w = (0..n)
                    .min_by(|&a, &b| best[a].1.total_cmp(&best[b].1))
                    .expect("width > 0");
                if p > best[w].1 {
                    best[w] = (t, p);
                }
            }
        }
        if n == 0 {
            return; // nothing to offer: the key keeps what it had
        }
        let slot = self.head;
        self.head = (self.head + 1) % self.slots;
        if slot == self.owner.len() {
            if slot == self.owner.capacity() {
                // Doubling, but never past `slots` rows: the bound is what is allocated.
                let rows = (2 * slot).max(16).min(self.slots) - slot;
                self.owner.reserve_exact(rows);
                self.ids.reserve_exact(rows * self.width);
                self.probs.reserve_exact(rows * self.width);
            }
            self.owner.push(None);
            self.ids.resize(self.ids.len() + self.width, 0);
            self.probs.resize(self.probs.len() + self.width, 0.0);
        }
        if let Some(old) = self.owner[slot].take() {
            self.map.remove(&old);
        }
        if let Some(prev) = self.map.insert(key, slot as u32) {
            self.owner[prev as usize] = None;
        }
        self.owner[slot] = Some(key);
        best[..n].sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let at = slot * self.width;
        let row_ids = &mut self.ids[at..at + self.width];
        let row_probs = &mut self.probs[at..at + self.width];
        for (j, (t, p)) in row_ids.iter_mut().zip(row_probs.iter_mut()).enumerate() {
            (*t, *p) = if j < n { best[j] } else { (0, 0.0) };
        }
    }

    /// The row stored under `key`: (ids, probabilities), best first, without its empty tail.
    pub fn get(&self, key: &Key) -> Option<(&[u32], &[f32])> {
        let slot = *self.map.get(key)? as usize;
        let at = slot * self.width;
        let probs = &self.probs[at..at + self.width];
        let n = probs.iter().position(|&p| p <= 0.0).unwrap_or(self.width);
        Some((&self.ids[at..at + n], &probs[..n]))
    }

    /// The row for the node whose token is `tok` after `prev` (`None`: no token before it):
    /// the pair's row if stored, else the token's own.
    pub fn lookup(&self, ns: u64, prev: Option<u32>, tok: u32) -> Option<(&[u32], &[f32])> {
        if let Some(p) = prev.filter(|&p| p != ALONE) {
            if let Some(r) = self.get(&(ns, p, tok)) {
                return Some(r);
            }
        }
        self.get(&(ns, ALONE, tok))
    }

    /// Checks the table's bookkeeping: every key's slot holds that key, every owned slot is
    /// in the map, no more entries than slots, rows sorted and in (0, 1].
    pub fn check(&self) -> Result<(), String> {
        if self.map.len() > self.slots {
            return Err(format!(
                "{} entries in {} slots",
                self.map.len(),
                self.slots
            ));
        }
        for (k, &s) in &self.map {
            if self.owner.get(s as usize).copied().flatten() != Some(*k) {
                return Err(format!(
                    "key {k:?} points at slot {s} which does not hold it"
                ));
            }
        }
        let owned = self.owner.iter().filter(|o| o.is_some()).count();
        if owned != self.map.len() {
            return Err(format!("{owned} owned slots, {} keys", self.map.len()));
        }
        for k in self.map.keys() {
            let (_, p) = self.get(k).expect("listed");
            if p.iter().any(|&x| !(x > 0.0 && x <= 1.0)) || p.windows(2).any(|w| w[0] < w[1]) {
                return Err(format!("row of {k:?} unsorted or out of (0, 1]: {p:?}"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_best_width_sorted() {
        let mut r = Recycled::new(3, 4);
        r.put(
            (0, ALONE, 5),
            &[(1, 0.1), (2, 0.5), (3, 0.0), (4, 0.3), (6, 0.05), (7, 0.4)],
        );
        let (ids, p) = r.get(&(0, ALONE, 5)).unwrap();
        assert_eq!(ids, &[2, 7, 4]);
        assert_eq!(p, &[0.5, 0.4, 0.3]);
        r.check().unwrap();
    }

    #[test]
    fn a_token_given_twice_is_kept_once() {
        let mut r = Recycled::new(3, 4);
        r.put((0, ALONE, 5), &[(1, 0.2), (2, 0.3), (1, 0.4), (1, 0.1)]);
        assert_eq!(
            r.get(&(0, ALONE, 5)).unwrap(),
            (&[1, 2][..], &[0.4, 0.3][..])
        );
        r.check().unwrap();
    }

    #[test]
    fn newest_write_wins_and_oldest_goes_first() {
        let mut r = Recycled::new(2, 3);
        r.put((0, ALONE, 1), &[(10, 0.9)]);
        r.put((0, ALONE, 2), &[(20, 0.9)]);
        r.put((0, ALONE, 1), &[(11, 0.8)]); // moves key 1 to slot 2
        assert_eq!(r.get(&(0, ALONE, 1)).unwrap().0, &[11]);
        assert_eq!(r.len(), 2);
        r.put((0, ALONE, 3), &[(30, 0.9)]); // slot 0: a hole, nothing dropped
        assert_eq!(r.len(), 3);
        r.put((0, ALONE, 4), &[(40, 0.9)]); // slot 1: drops key 2, the oldest
        assert!(r.get(&(0, ALONE, 2)).is_none());
        assert_eq!(r.get(&(0, ALONE, 1)).unwrap().0, &[11]);
        r.check().unwrap();
    }

    #[test]
    fn pair_first_then_token_and_namespaces_apart() {
        let mut r = Recycled::new(2, 8);
        r.put((0, ALONE, 5), &[(1, 0.5)]);
        r.put((0, 4, 5), &[(2, 0.5)]);
        r.put((1, ALONE, 5), &[(3, 0.5)]);
        assert_eq!(r.lookup(0, Some(4), 5).unwrap(), (&[2][..], &[0.5][..]));
        assert_eq!(r.lookup(0, Some(9), 5).unwrap(), (&[1][..], &[0.5][..]));
        assert_eq!(r.lookup(0, None, 5).unwrap().0, &[1]);
        assert_eq!(r.lookup(1, Some(4), 5).unwrap().0, &[3]);
        assert!(r.lookup(2, None, 5).is_none());
    }

    #[test]
    fn bounded_under_a_long_random_stream() {
        let mut r = Recycled::new(4, 100);
        let mut x = 12345u64;
        let mut rnd = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n) as u32
        };
        for i in 0..20_000 {
            let key = (u64::from(rnd(3)), rnd(40), rnd(40));
            let row: Vec<(u32, f32)> = (0..rnd(7))
                .map(|j| (j, 1.0 / (1 + rnd(9)) as f32))
                .collect();
            r.put(key, &row);
            assert!(r.len() <= 100);
            if i % 997 == 0 {
                r.check().unwrap();
            }
        }
        // Rows, owners, and a map of at most 100 keys (hashbrown: 128 or 256 buckets).
        let bound = 100 * (4 * 8 + std::mem::size_of::<Option<Key>>())
            + 256 * (std::mem::size_of::<(Key, u32)>() + 1);
        for _ in 0..5_000 {
            r.put((0, rnd(40), rnd(40)), &[(1, 0.5)]);
            assert!(r.bytes() <= bound, "{} > {bound}", r.bytes());
        }
        r.check().unwrap();
    }

    #[test]
    fn an_empty_row_is_not_stored() {
        let mut r = Recycled::new(2, 4);
        r.put((0, ALONE, 1), &[(2, 0.5)]);
        r.put((0, ALONE, 1), &[(3, 0.0), (4, f32::NAN)]);
        assert_eq!(r.get(&(0, ALONE, 1)).unwrap().0, &[2]);
        r.put((0, ALONE, 9), &[]);
        assert_eq!(r.len(), 1);
        r.check().unwrap();
    }

    #[test]
    fn off_keeps_nothing() {
        let mut r = Recycled::new(0, 100);
        r.put((0, ALONE, 1), &[(2, 0.5)]);
        assert!(r.is_empty() && !r.enabled());
    }
}
