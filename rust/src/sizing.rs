//! The cost-aware sizer's arithmetic for one step (`lookahead.sizing.CostAwareSizer.cut`): the
//! expected accepted length of each best-first prefix of a draft, from a table of acceptance
//! chances, and the prefix that maximises expected tokens per second under a cost curve.
//!
//! The table is the calibration's (crate::calibration, `lookahead.calibration`), the curve
//! Python's (`lookahead.learned_costs`); this is the cut's inner loop, which ran every step in
//! Python at 76-97 µs on llama.cpp's 135M model (a forward there is 8-10 ms).
//! Every operation is the Python reference's (`AcceptanceCalibration.expected`,
//! `choose_nodes`) in the same order in f64, so both give the same numbers bit for bit.

use crate::error::{Error, Result};

/// The chance table and its axes: `chances[group * bands.len() + band]`, `bands` the score
/// bands' lower edges (ascending, the first 0), `groups` the match groups' lower edges
/// (ascending: group g holds `matched` in [groups[g-1], groups[g])), as
/// `crate::calibration::Calibration::table` checks and builds it (a node's cell:
/// `crate::calibration::cell`).
pub struct ChanceTable<'a> {
    pub chances: &'a [f64],
    pub bands: &'a [f64],
    pub groups: &'a [i64],
}

impl ChanceTable<'_> {
    fn chance(&self, cond: f64, matched: i64) -> f64 {
        self.chances[crate::calibration::cell(self.bands, self.groups, cond, matched)]
    }
}

/// Expected accepted length of each prefix of a best-first draft without its root: node i's
/// path score `scores[i]`, parent `parents[i]` (0 the root, j > 0 node j - 1; so at most i),
/// match `matched[i]`. `out[k - 1]` is the first k nodes' (`AcceptanceCalibration.expected`):
/// a node is accepted with its parent's chance times its own, capped by what its parent has
/// left once its earlier siblings took theirs.
pub fn expected_lengths(
    table: &ChanceTable<'_>,
    scores: &[f64],
    parents: &[i32],
    matched: &[u8],
    out: &mut Vec<f64>,
) -> Result<()> {
    let n = scores.len();
    if parents.len() != n || matched.len() != n {
        return Err(Error::InvalidInput(format!(
            "scores, parents and matched must have one length, got {}, {}, {}",
            n,
            parents.len(),
            matched.len()
        )));
    }
    out.clear();
    out.reserve(n);
    let mut left = vec![1.0f64; n + 1];
    let mut chance = vec![1.0f64; n + 1];
    let mut total = 0.0f64;
    for i in 0..n {
        let p = parents[i];
        if p < 0 || p as usize > i {
            return Err(Error::InvalidInput(format!(
                "parents[{i}] = {p}: a node's parent is the root (0) or an earlier node"
            )));
        }
        let p = p as usize;
        let s = scores[i];
        if s.is_nan() {
            return Err(Error::InvalidInput(format!("scores[{i}] is NaN")));
        }
        let above = if p == 0 { 1.0 } else { scores[p - 1] };
        let cond = if above > 0.0 { s / above } else { 0.0 };
        let c = table.chance(cond, i64::from(matched[i])) * chance[p];
        let c = c.min(left[p]).max(0.0);
        left[p] -= c;
        chance[i + 1] = c;
        left[i + 1] = c;
        total += c;
        out.push(total);
    }
    Ok(())
}

/// How many of the draft's first nodes to verify: the k maximising
/// (1 + expected[k - 1]) / (costs[k + 1] + host_s + (switch_s if k > 0)), k = 0 (the root
/// alone) included, the first maximum on ties (`lookahead.sizing.choose_nodes`).
pub fn choose_nodes(expected: &[f64], costs: &[f64], host_s: f64, switch_s: f64) -> usize {
    let k_max = expected.len().min(costs.len().saturating_sub(2));
    if k_max == 0 {
        return 0;
    }
    let rate = |k: usize| {
        let (gain, extra) = if k == 0 {
            (1.0, 0.0)
        } else {
            (1.0 + expected[k - 1], switch_s)
        };
        gain / (costs[k + 1] + host_s + extra)
    };
    // numpy's argmax: the first maximum, or the first NaN where there is one.
    let (mut best, mut best_rate) = (0, rate(0));
    if best_rate.is_nan() {
        return 0;
    }
    for k in 1..=k_max {
        let r = rate(k);
        if r.is_nan() {
            return k;
        }
        if r > best_rate {
            (best, best_rate) = (k, r);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    const BANDS: [f64; 3] = [0.0, 0.3, 0.6];
    const GROUPS: [i64; 1] = [2];

    fn table(chances: &[f64]) -> ChanceTable<'_> {
        ChanceTable {
            chances,
            bands: &BANDS,
            groups: &GROUPS,
        }
    }

    #[test]
    fn chains_multiply_and_siblings_share_their_parent() {
        let t = [0.1, 0.5, 0.9, 0.2, 0.6, 1.0];
        let tab = table(&t);
        let mut out = Vec::new();
        // Two children of the root (0.7 and 0.45 conditional), a grandchild under the first.
        expected_lengths(&tab, &[0.7, 0.45, 0.35], &[0, 0, 1], &[1, 3, 1], &mut out).unwrap();
        // node 0: band 2 group 0 -> 0.9; node 1: band 1 group 1 -> 0.6, capped at 0.1 left;
        // node 2: conditional 0.5 -> band 1 group 0 -> 0.5 x 0.9.
        let want = [0.9, 0.9 + 0.1, 0.9 + 0.1 + 0.45];
        for (a, b) in out.iter().zip(want) {
            assert!((a - b).abs() < 1e-12, "{out:?}");
        }
    }

    #[test]
    fn bad_inputs_are_refused() {
        let t = [0.5; 6];
        let mut out = Vec::new();
        let tab = table(&t);
        assert!(expected_lengths(&tab, &[0.5], &[1], &[0], &mut out).is_err());
        assert!(expected_lengths(&tab, &[0.5], &[-1], &[0], &mut out).is_err());
        assert!(expected_lengths(&tab, &[0.5, 0.2], &[0], &[0, 0], &mut out).is_err());
        assert!(expected_lengths(&tab, &[f64::NAN], &[0], &[0], &mut out).is_err());
    }

    #[test]
    fn choice_matches_the_rule() {
        let flat = [f64::NAN, 1.0, 1.0, 1.0, 1.0];
        assert_eq!(choose_nodes(&[0.5, 1.0, 1.5], &flat, 0.0, 0.0), 3);
        // What a draft adds to the next forward: the same draft no longer pays.
        assert_eq!(choose_nodes(&[0.5, 1.0, 1.5], &flat, 0.0, 2.0), 0);
        let steep = [f64::NAN, 1.0, 2.0, 3.0, 4.0];
        assert_eq!(choose_nodes(&[0.9, 1.7, 2.4], &steep, 0.0, 0.0), 0); // ties and worse: root
        assert_eq!(choose_nodes(&[0.99, 1.98, 2.97], &steep, 0.0, 0.0), 0);
        assert_eq!(choose_nodes(&[0.99, 1.98, 2.97], &steep, 5.0, 0.0), 3);
        assert_eq!(choose_nodes(&[], &steep, 0.0, 0.0), 0);
        let ones: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(choose_nodes(&ones, &flat, 0.0, 0.0), 3); // no wider than the curve
    }
}
