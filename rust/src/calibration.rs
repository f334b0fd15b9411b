//! The acceptance calibration's state and learning (`lookahead.calibration`): how often the
//! target followed a draft node where it had accepted the node's parent, by the node's score
//! band and match group, faded by age, read as a chance table that is non-decreasing in the
//! score. One verify step is one call (`learn`: the step's outcomes, counted in), and the
//! table is current for the next step's cut (`crate::sizing`).
//!
//! The policy (the bands, the groups, the prior's weight, the fading) is chosen and documented
//! in Python; this is its bookkeeping, which ran after every forward in Python at 40-60 µs a
//! step on llama.cpp's 135M model (right after a forward, with the CPU's caches full of
//! weights, each numpy call there cost several µs).

use crate::error::{Error, Result};
use crate::sizing::ChanceTable;

/// What a verify step says of a draft's nodes whose parent it accepted: pushes each such node
/// (root excluded, in order) to `nodes` and whether the target followed it to `followed`.
/// `tokens` and `parents` are the whole tree (node 0 the root, `parents[0]` ignored), `path`
/// the accepted nodes (root first), `emitted[i]` the token that followed `path[i]`. Greedy
/// (`verified` None): every child of an accepted node, followed iff it is the token the
/// target chose there (verified or not: a cut child would have been accepted iff so).
/// Sampled: the children among the first `verified` nodes (root included), followed iff on
/// the path.
pub fn outcomes(
    tokens: &[i64],
    parents: &[i64],
    path: &[i64],
    emitted: &[i64],
    verified: Option<usize>,
    nodes: &mut Vec<usize>,
    followed: &mut Vec<bool>,
) -> Result<()> {
    let n = tokens.len();
    if parents.len() != n {
        return Err(Error::InvalidInput(format!(
            "tokens and parents must have one length, got {} and {}",
            n,
            parents.len()
        )));
    }
    if path.len() != emitted.len() {
        return Err(Error::InvalidInput(format!(
            "path and emitted must have one length, got {} and {}",
            path.len(),
            emitted.len()
        )));
    }
    // The token the target chose after each accepted node (None: not accepted).
    let mut next: Vec<Option<i64>> = vec![None; n];
    for (&node, &tok) in path.iter().zip(emitted) {
        if node < 0 || node as usize >= n {
            return Err(Error::InvalidInput(format!(
                "path holds node {node}, not in a tree of {n} nodes"
            )));
        }
        next[node as usize] = Some(tok);
    }
    nodes.clear();
    followed.clear();
    let last = verified.map_or(n, |v| v.min(n));
    for j in 1..last {
        let p = parents[j];
        if p < 0 || p as usize >= j {
            return Err(Error::InvalidInput(format!(
                "parents[{j}] = {p}: a node's parent is an earlier node"
            )));
        }
        if let Some(tok) = next[p as usize] {
            nodes.push(j);
            followed.push(match verified {
                None => tokens[j] == tok,
                Some(_) => next[j].is_some(),
            });
        }
    }
    Ok(())
}

/// The calibration: counts `[group * bands + band]` of nodes offered and followed, each step
/// fading the earlier ones by `decay`, and the chance table they give with the prior.
pub struct Calibration {
    bands: Vec<f64>,
    groups: Vec<i64>,
    /// The prior's chance per band: its middle score (the last band's upper edge is 1).
    prior: Vec<f64>,
    prior_weight: f64,
    decay: f64,
    offered: Vec<f64>,
    accepted: Vec<f64>,
    table: Vec<f64>,
    /// The table lags the counts (rebuilt on the next read).
    stale: bool,
    nodes: Vec<usize>,
    followed: Vec<bool>,
}

impl Calibration {
    /// A calibration with no evidence yet: `bands` the score bands' lower edges (ascending,
    /// the first 0, the last below 1), `groups` the match groups' lower edges (ascending),
    /// the prior worth `prior_weight` (> 0) nodes per cell, `decay` in (0, 1].
    pub fn new(bands: &[f64], groups: &[i64], prior_weight: f64, decay: f64) -> Result<Self> {
        let ascending = bands.windows(2).all(|w| w[0] < w[1]);
        if bands.first() != Some(&0.0) || !ascending || bands.last().is_some_and(|&x| x >= 1.0) {
            return Err(Error::InvalidInput(
                "the score bands' edges must be ascending, from 0, below 1".into(),
            ));
        }
        if !groups.windows(2).all(|w| w[0] < w[1]) {
            return Err(Error::InvalidInput(
                "the match groups' edges must be ascending".into(),
            ));
        }
        check_prior_weight(prior_weight)?;
        if !(decay > 0.0 && decay <= 1.0) {
            return Err(Error::InvalidInput(format!(
                "decay must be in (0, 1], got {decay}"
            )));
        }
        let upper = bands[1..].iter().chain(std::iter::once(&1.0));
        let prior = bands
            .iter()
            .zip(upper)
            .map(|(a, b)| (a + b) / 2.0)
            .collect();
        let cells = (groups.len() + 1) * bands.len();
        Ok(Calibration {
            bands: bands.to_vec(),
            groups: groups.to_vec(),
            prior,
            prior_weight,
            decay,
            offered: vec![0.0; cells],
            accepted: vec![0.0; cells],
            table: vec![0.0; cells],
            stale: true,
            nodes: Vec::new(),
            followed: Vec::new(),
        })
    }

    pub fn shape(&self) -> (usize, usize) {
        (self.groups.len() + 1, self.bands.len())
    }

    pub fn offered(&self) -> &[f64] {
        &self.offered
    }

    pub fn accepted(&self) -> &[f64] {
        &self.accepted
    }

    pub fn prior_weight(&self) -> f64 {
        self.prior_weight
    }

    pub fn decay(&self) -> f64 {
        self.decay
    }

    /// Sets the prior's weight (> 0): the table follows at its next read.
    pub fn set_prior_weight(&mut self, w: f64) -> Result<()> {
        check_prior_weight(w)?;
        self.prior_weight = w;
        self.stale = true;
        Ok(())
    }

    /// The prior's chance per score band: the band's middle score.
    pub fn prior(&self) -> &[f64] {
        &self.prior
    }

    /// The `(group, band)` of a node of conditional score `cond` continuing a match of
    /// `matched` tokens (`cell`); InvalidInput on a NaN score.
    pub fn locate(&self, cond: f64, matched: i64) -> Result<(usize, usize)> {
        if cond.is_nan() {
            return Err(Error::InvalidInput("a conditional score is NaN".into()));
        }
        let c = cell(&self.bands, &self.groups, cond, matched);
        Ok((c / self.bands.len(), c % self.bands.len()))
    }

    /// One verify step's nodes whose parent was accepted: each one's conditional score,
    /// `matched` and whether the target followed it. The counts so far fade by `decay` first.
    pub fn observe(&mut self, cond: &[f64], matched: &[i64], followed: &[bool]) -> Result<()> {
        if matched.len() != cond.len() || followed.len() != cond.len() {
            return Err(Error::InvalidInput(format!(
                "cond, matched and followed must have one length, got {}, {}, {}",
                cond.len(),
                matched.len(),
                followed.len()
            )));
        }
        if let Some(i) = cond.iter().position(|c| c.is_nan()) {
            return Err(Error::InvalidInput(format!("cond[{i}] is NaN")));
        }
        self.fade();
        for ((&c, &m), &f) in cond.iter().zip(matched).zip(followed) {
            self.count(c, m, f);
        }
        Ok(())
    }

    fn fade(&mut self) {
        for x in self.offered.iter_mut().chain(self.accepted.iter_mut()) {
            *x *= self.decay;
        }
        self.stale = true;
    }

    fn count(&mut self, cond: f64, matched: i64, followed: bool) {
        let i = cell(&self.bands, &self.groups, cond, matched);
        self.offered[i] += 1.0;
        if followed {
            self.accepted[i] += 1.0;
        }
    }

    /// Learns one verify step of a draft (`tokens`, `parents`, path `scores`, `matched`: the
    /// whole tree before the cut, root first, its score 1) from the accepted `path` and the
    /// `emitted` tokens (`outcomes`; `verified`: the sampled case's verified nodes, root
    /// included). Returns what the draft accepted, and in greedy decoding one more where a
    /// cut child of the last accepted node would have been accepted (not drafting must not
    /// look like failing).
    #[allow(clippy::too_many_arguments)]
    pub fn learn(
        &mut self,
        tokens: &[i64],
        parents: &[i64],
        scores: &[f64],
        matched: &[i64],
        path: &[i64],
        emitted: &[i64],
        verified: Option<usize>,
    ) -> Result<usize> {
        let n = tokens.len();
        if scores.len() != n || matched.len() != n {
            return Err(Error::InvalidInput(format!(
                "tokens, scores and matched must have one length, got {}, {}, {}",
                n,
                scores.len(),
                matched.len()
            )));
        }
        outcomes(
            tokens,
            parents,
            path,
            emitted,
            verified,
            &mut self.nodes,
            &mut self.followed,
        )?;
        if let Some(&j) = self.nodes.iter().find(|&&j| scores[j].is_nan()) {
            return Err(Error::InvalidInput(format!("scores[{j}] is NaN")));
        }
        self.fade();
        for i in 0..self.nodes.len() {
            let (j, f) = (self.nodes[i], self.followed[i]);
            let above = scores[parents[j] as usize];
            // A hand-built draft may score a parent 0: its children say nothing beyond it.
            let cond = if above > 0.0 { scores[j] / above } else { 0.0 };
            self.count(cond, matched[j], f);
        }
        Ok(match verified {
            Some(_) => path.len().saturating_sub(1),
            None => self.followed.iter().filter(|&&f| f).count(),
        })
    }

    /// The chance table (`[group * bands + band]`): followed over offered with the prior,
    /// made non-decreasing in the band within each group (pool-adjacent-violators).
    pub fn table(&mut self) -> ChanceTable<'_> {
        if self.stale {
            let nb = self.bands.len();
            let pw = self.prior_weight;
            for g in 0..=self.groups.len() {
                let row = g * nb..(g + 1) * nb;
                let mut w = Vec::with_capacity(nb);
                for (i, b) in row.clone().zip(0..nb) {
                    let wi = self.offered[i] + pw;
                    self.table[i] = (self.accepted[i] + pw * self.prior[b]) / wi;
                    w.push(wi);
                }
                let v = &mut self.table[row];
                if v.windows(2).any(|x| x[1] < x[0]) {
                    isotonic(v, &w);
                }
            }
            self.stale = false;
        }
        ChanceTable {
            chances: &self.table,
            bands: &self.bands,
            groups: &self.groups,
        }
    }
}

/// The cell `[group * bands.len() + band]` of a node of conditional score `cond` continuing
/// a match of `matched` tokens, the one reading of the table's axes: its band the last whose
/// lower edge is at most `cond` (band 0 below the first edge, and for NaN), its group the
/// number of group edges at most `matched` (`bands` and `groups` the lower edges, ascending).
pub fn cell(bands: &[f64], groups: &[i64], cond: f64, matched: i64) -> usize {
    let band = bands.partition_point(|&e| e <= cond).saturating_sub(1);
    let group = groups.partition_point(|&e| e <= matched);
    group * bands.len() + band
}

fn check_prior_weight(w: f64) -> Result<()> {
    if w > 0.0 && w.is_finite() {
        Ok(())
    } else {
        Err(Error::InvalidInput(format!(
            "prior_weight must be a finite number > 0, got {w}"
        )))
    }
}

/// `v` replaced by the non-decreasing sequence nearest it in `w`-weighted squares
/// (pool-adjacent-violators; `lookahead.calibration.isotonic`).
pub fn isotonic(v: &mut [f64], w: &[f64]) {
    // Pools: (value, weight, size), each pool's value above the one before it.
    let mut pools: Vec<(f64, f64, usize)> = Vec::with_capacity(v.len());
    for (&x, &y) in v.iter().zip(w) {
        pools.push((x, y, 1));
        while pools.len() > 1 && pools[pools.len() - 2].0 > pools[pools.len() - 1].0 {
            let (x2, y2, n2) = pools.pop().unwrap();
            let (x1, y1, n1) = pools.pop().unwrap();
            pools.push(((x1 * y1 + x2 * y2) / (y1 + y2), y1 + y2, n1 + n2));
        }
    }
    let mut i = 0;
    for (x, _, n) in pools {
        v[i..i + n].fill(x);
        i += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BANDS: [f64; 3] = [0.0, 0.3, 0.6];
    const GROUPS: [i64; 1] = [2];

    #[test]
    fn outcomes_greedy_and_sampled() {
        // root -> 1 (10), 2 (11); 1 -> 3 (12), 4 (13)
        let (toks, pars) = ([9, 10, 11, 12, 13], [-1, 0, 0, 1, 1]);
        let (mut nodes, mut followed) = (Vec::new(), Vec::new());
        outcomes(
            &toks,
            &pars,
            &[0, 1],
            &[10, 13],
            None,
            &mut nodes,
            &mut followed,
        )
        .unwrap();
        assert_eq!(nodes, [1, 2, 3, 4]);
        assert_eq!(followed, [true, false, false, true]);
        outcomes(
            &toks,
            &pars,
            &[0, 1],
            &[10, 13],
            Some(3),
            &mut nodes,
            &mut followed,
        )
        .unwrap();
        assert_eq!(
            (nodes.as_slice(), followed.as_slice()),
            (&[1, 2][..], &[true, false][..])
        );
        let bad = outcomes(
            &toks,
            &pars,
            &[0, 5],
            &[1, 2],
            None,
            &mut nodes,
            &mut followed,
        );
        assert!(bad.is_err());
        let bad = outcomes(
            &toks,
            &[-1, 0, 3, 1, 1],
            &[0],
            &[1],
            None,
            &mut nodes,
            &mut followed,
        );
        assert!(bad.is_err());
    }

    #[test]
    fn a_nodes_cell_reads_lower_edges() {
        // Bands [0, 0.3), [0.3, 0.6), [0.6, ...); groups (.., 2), [2, ..).
        let at = |c, m| cell(&BANDS, &GROUPS, c, m);
        assert_eq!(
            [at(-0.5, 0), at(0.0, 1), at(0.29, 1), at(0.3, 1)],
            [0, 0, 0, 1]
        );
        assert_eq!([at(0.6, 2), at(1.0, 9), at(0.0, -4)], [5, 5, 0]);
        let cal = Calibration::new(&BANDS, &GROUPS, 1.0, 1.0).unwrap();
        assert_eq!(cal.locate(0.45, 7).unwrap(), (1, 1));
        assert!(cal.locate(f64::NAN, 0).is_err());
    }

    #[test]
    fn learning_moves_the_table_and_keeps_it_monotone() {
        let mut cal = Calibration::new(&BANDS, &GROUPS, 2.0, 1.0).unwrap();
        // prior: band middles 0.15, 0.45, 0.8
        let close = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-12);
        let t = cal.table().chances.to_vec();
        assert!(close(&t, &[0.15, 0.45, 0.8, 0.15, 0.45, 0.8]), "{t:?}");
        // Low scores always followed, high ones never, in group 0: pooled, not reversed.
        for _ in 0..50 {
            cal.observe(&[0.1, 0.7], &[0, 0], &[true, false]).unwrap();
        }
        let t = cal.table().chances.to_vec();
        assert!(t[..3].windows(2).all(|w| w[0] <= w[1]), "{t:?}");
        assert!(close(&t[3..], &[0.15, 0.45, 0.8]), "{t:?}");
        // The whole step from a tree: root -> 1 (score 0.5, matched 3) accepted, -> 2 not.
        let n = cal
            .learn(
                &[9, 10, 11],
                &[-1, 0, 1],
                &[1.0, 0.5, 0.1],
                &[0, 3, 3],
                &[0, 1],
                &[10, 7],
                None,
            )
            .unwrap();
        assert_eq!(n, 1);
        assert_eq!(cal.offered()[3 + 1], 1.0); // node 1: cond 0.5 -> band 1, group 1
        assert_eq!(cal.offered()[3], 1.0); // node 2: cond 0.2 -> band 0, group 1
        assert_eq!(cal.accepted()[3 + 1], 1.0);
        assert!(Calibration::new(&[0.1, 0.5], &GROUPS, 1.0, 1.0).is_err());
        assert!(Calibration::new(&BANDS, &GROUPS, 0.0, 1.0).is_err());
        assert!(Calibration::new(&BANDS, &GROUPS, 1.0, 1.5).is_err());
        assert!(close(cal.prior(), &[0.15, 0.45, 0.8]));
        assert!(cal.set_prior_weight(f64::NAN).is_err());
        assert!(cal.set_prior_weight(4.0).is_ok() && cal.prior_weight() == 4.0);
    }

    #[test]
    fn isotonic_pools_violators() {
        let mut v = [1.0, 3.0, 2.0, 4.0];
        isotonic(&mut v, &[1.0, 1.0, 1.0, 1.0]);
        assert_eq!(v, [1.0, 2.5, 2.5, 4.0]);
        let mut v = [3.0, 1.0];
        isotonic(&mut v, &[3.0, 1.0]);
        assert_eq!(v, [2.5, 2.5]);
    }
}
