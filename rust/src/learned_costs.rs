//! What verify forwards cost, learnt from the forwards an engine runs
//! (`lookahead.learned_costs`): per context band and row count, the last `window` forwards as
//! log-ratios to a prior curve (`CostGrid`, the start-up measurement of `lookahead.costs`),
//! read back as the prior times the median ratio shrunk towards the prior's 1, interpolated
//! in rows between measured row counts, pooled over bands where a band has none; and what a
//! wider forward adds to the one-row forwards after it (`switch_frac`).
//!
//! The policy (the bands, the window, the prior's weight, when a one-row forward is a
//! switch) is chosen and documented in Python; this is its bookkeeping. In Python it cost
//! 25-27 µs a step right after a llama.cpp forward of the 135M model (the curve's read
//! 15-17, the count 10: numpy calls and dict lookups with the CPU's caches full of weights),
//! and it needed a refresh every 8 forwards to cost that little; here each forward is counted
//! in at once and the curve is rebuilt from the counts when read.

use std::collections::VecDeque;

use crate::error::{Error, Result};

/// A forward's seconds by rows (`widths`, rising from 1) at each of `contexts` cached
/// tokens (rising from >= 0): `seconds[c * widths + w]`, every one positive and finite.
#[derive(Clone, Debug)]
pub struct CostGrid {
    /// The widths as numbers, as the interpolation in rows reads them.
    widths: Vec<f64>,
    max_rows: usize,
    contexts: Vec<i64>,
    seconds: Vec<f64>,
}

/// The 16-token bucket a context is read at (curves differ little within 16 tokens).
pub fn bucket(context_len: i64) -> i64 {
    context_len.max(0) / 16 * 16
}

/// `np.interp(x, xp, fp)` at one point, rounded as numpy rounds it (the slope first): linear
/// between the points, their end values beyond.
fn interp(x: f64, xp: &[f64], fp: &[f64]) -> f64 {
    let i = xp.partition_point(|&p| p <= x);
    if i == 0 {
        return fp[0];
    }
    if i == xp.len() {
        return fp[fp.len() - 1];
    }
    let (x0, x1) = (xp[i - 1], xp[i]);
    if x == x0 {
        return fp[i - 1];
    }
    let slope = (fp[i] - fp[i - 1]) / (x1 - x0);
    slope * (x - x0) + fp[i - 1]
}

impl CostGrid {
    pub fn new(widths: &[usize], contexts: &[i64], seconds: &[f64]) -> Result<Self> {
        let rising = |v: &[i64]| v.windows(2).all(|w| w[0] < w[1]);
        let ws: Vec<i64> = widths.iter().map(|&w| w as i64).collect();
        if widths.first() != Some(&1) || !rising(&ws) {
            return Err(Error::InvalidInput(format!(
                "widths must rise from 1, got {widths:?}"
            )));
        }
        if contexts.is_empty() || !rising(contexts) || contexts[0] < 0 {
            return Err(Error::InvalidInput(format!(
                "contexts must rise from >= 0, got {contexts:?}"
            )));
        }
        let n = widths.len() * contexts.len();
        if seconds.len() != n || !seconds.iter().all(|&s| s > 0.0 && s.is_finite()) {
            return Err(Error::InvalidInput(format!(
                "seconds must be {} x {} positive numbers, got {} values",
                contexts.len(),
                widths.len(),
                seconds.len()
            )));
        }
        Ok(CostGrid {
            widths: widths.iter().map(|&w| w as f64).collect(),
            max_rows: widths[widths.len() - 1],
            contexts: contexts.to_vec(),
            seconds: seconds.to_vec(),
        })
    }

    /// The widest row count measured.
    pub fn max_rows(&self) -> usize {
        self.max_rows
    }

    /// Seconds of a forward of r rows over `context_len` cached tokens at `out[r]` (`out[0]`
    /// NaN), for r up to `max_rows`: linear between widths, and between measured contexts
    /// (extrapolated past the longest from the last two, never below the shortest's); read at
    /// the context's 16-token bucket (`lookahead.costs.CostModel.curve`).
    pub fn curve_into(&self, context_len: i64, out: &mut Vec<f64>) {
        let at = self.at_context(context_len);
        out.clear();
        out.push(f64::NAN);
        out.extend((1..=self.max_rows).map(|r| interp(r as f64, &self.widths, &at)));
    }

    /// Seconds of a forward of `rows` rows (1 to `max_rows`) over `context_len` cached tokens:
    /// `curve_into`'s value there.
    pub fn seconds(&self, rows: usize, context_len: i64) -> f64 {
        interp(rows as f64, &self.widths, &self.at_context(context_len))
    }

    /// The seconds at each width, read at the context's bucket.
    fn at_context(&self, context_len: i64) -> Vec<f64> {
        let nw = self.widths.len();
        let c = &self.contexts;
        let b = bucket(context_len);
        let row = |i: usize| &self.seconds[i * nw..(i + 1) * nw];
        if c.len() == 1 || b <= c[0] {
            row(0).to_vec()
        } else {
            let i = c.partition_point(|&x| x < b).min(c.len() - 1);
            let t = (b - c[i - 1]) as f64 / (c[i] - c[i - 1]) as f64;
            let (lo, hi, first) = (row(i - 1), row(i), row(0));
            (0..nw)
                .map(|w| (lo[w] + t * (hi[w] - lo[w])).max(first[w]))
                .collect()
        }
    }
}

/// The median of a few numbers.
fn median(v: impl Iterator<Item = f64>) -> f64 {
    let mut s: Vec<f64> = v.collect();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// The policy `LearnedCosts` follows (`lookahead.learned_costs` documents each).
#[derive(Clone, Debug)]
pub struct Policy {
    /// Context bands' lower edges (cached tokens), rising from 0.
    pub bands: Vec<i64>,
    /// Forwards kept per (band, rows).
    pub window: usize,
    /// The prior counts as this many forwards of ratio 1.
    pub prior_count: f64,
    /// One-row forwards of a band measured before a switch's excess is read against them.
    pub switch_base: usize,
    /// One-row forwards after a wider forward (or a prompt) before one-row forwards count as
    /// settled again: those before are the switch's (the wider forward's after-effect).
    pub settle: usize,
    /// Keep the one-row forwards after a wider one apart (the switch's excess).
    pub switches: bool,
}

/// The one-row forwards since the last wider forward or prompt, not yet settled.
#[derive(Clone, Copy, Debug)]
struct Tail {
    /// After a draft's forward (its excess is the draft's), not after a prompt.
    charged: bool,
    /// One-row forwards left before they count as settled.
    left: usize,
    /// Their summed excess over the band's settled one-row forward, as a fraction of it.
    excess: f64,
    /// Whether any of them was read against a band's settled one-row forwards.
    measured: bool,
}

impl Tail {
    fn new(charged: bool, left: usize) -> Self {
        Tail {
            charged,
            left,
            excess: 0.0,
            measured: false,
        }
    }
}

/// Forward seconds by rows and context, learnt from measured forwards around a prior.
pub struct LearnedCosts {
    prior: CostGrid,
    policy: Policy,
    /// `[band * (max_rows + 1) + rows]`: the last `window` log(measured / prior).
    obs: Vec<VecDeque<f64>>,
    /// What each wider forward added to the one-row forwards after it, until they settled
    /// (or the next wider forward or prompt came): fractions of a settled one-row forward.
    switch: VecDeque<f64>,
    switch_frac: f64,
    /// Unsettled one-row forwards since the last wider forward or prompt (None: settled).
    tail: Option<Tail>,
    count: u64,
    /// The last curve read, and its bucket (None: a forward was counted in since).
    curve: Vec<f64>,
    curve_bucket: Option<i64>,
}

impl LearnedCosts {
    pub fn new(prior: CostGrid, policy: Policy) -> Result<Self> {
        if policy.window < 1 {
            return Err(Error::InvalidInput(
                "window must be at least 1 forward".into(),
            ));
        }
        let b = &policy.bands;
        if b.first() != Some(&0) || !b.windows(2).all(|w| w[0] < w[1]) {
            return Err(Error::InvalidInput(
                "the context bands' edges must rise from 0".into(),
            ));
        }
        if policy.settle < 1 {
            return Err(Error::InvalidInput(
                "settle must be at least 1 forward".into(),
            ));
        }
        if !(policy.prior_count >= 0.0 && policy.prior_count.is_finite()) {
            return Err(Error::InvalidInput(format!(
                "prior_count must be a finite number >= 0, got {}",
                policy.prior_count
            )));
        }
        let cells = b.len() * (prior.max_rows() + 1);
        Ok(LearnedCosts {
            obs: vec![VecDeque::new(); cells],
            switch: VecDeque::new(),
            switch_frac: 0.0,
            // The first forward follows a prompt.
            tail: Some(Tail::new(false, policy.settle)),
            count: 0,
            curve: Vec::new(),
            curve_bucket: None,
            prior,
            policy,
        })
    }

    /// The policy it follows.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Keeps one-row forwards right after wider ones apart (`switch_frac`) from now, or not.
    pub fn set_switches(&mut self, on: bool) {
        self.policy.switches = on;
    }

    pub fn max_rows(&self) -> usize {
        self.prior.max_rows()
    }

    /// Forwards measured in all.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// What a wider forward adds to the one-row forwards after it until they settle, as a
    /// fraction of a settled one-row forward (the median of the last `window` wider
    /// forwards' summed excess, shrunk like the ratios, never below 0; 0 until measured, or
    /// without `switches`).
    pub fn switch_frac(&self) -> f64 {
        self.switch_frac
    }

    /// Wider forwards' excesses kept (`window` at most) in the switch's.
    pub fn switches_kept(&self) -> usize {
        self.switch.len()
    }

    /// The context band of `context_len` cached tokens.
    pub fn band(&self, context_len: i64) -> usize {
        let b = &self.policy.bands;
        b.partition_point(|&e| e <= context_len.max(0)).max(1) - 1
    }

    fn cell(&self, band: usize, rows: usize) -> usize {
        band * (self.max_rows() + 1) + rows
    }

    /// The shrunk median log-ratio of some forwards: as if the prior were `prior_count` more
    /// forwards of ratio 1.
    fn shrunk(&self, v: impl Iterator<Item = f64> + Clone) -> f64 {
        let n = v.clone().count() as f64;
        median(v) * n / (n + self.policy.prior_count)
    }

    /// One forward of `rows` rows over `context_len` cached tokens took `seconds` (ignored when
    /// the prior does not reach `rows`, or `seconds` is not a positive time). With `switches`,
    /// a one-row forward among the first `settle` after a wider one (or a prompt) counts
    /// towards the wider one's excess (`switch_frac`), not the one-row forwards.
    pub fn observe(&mut self, rows: i64, context_len: i64, seconds: f64) {
        let valid = (1..=self.max_rows() as i64).contains(&rows)
            && seconds > 0.0
            && seconds < f64::INFINITY;
        if valid {
            self.count += 1;
            self.curve_bucket = None;
        }
        if self.policy.switches && rows > 1 {
            self.close_tail();
            self.tail = Some(Tail::new(true, self.policy.settle));
        } else if self.policy.switches && rows == 1 && self.tail.is_some() {
            if valid {
                self.read_excess(context_len, seconds);
            }
            if let Some(t) = self.tail.as_mut() {
                t.left -= 1;
                if t.left == 0 {
                    self.close_tail();
                }
            }
            return;
        }
        if !valid {
            return;
        }
        let rows = rows as usize;
        let ratio = (seconds / self.prior.seconds(rows, context_len)).ln();
        let cell = self.cell(self.band(context_len), rows);
        let kept = &mut self.obs[cell];
        if kept.len() == self.policy.window {
            kept.pop_front();
        }
        kept.push_back(ratio);
    }

    /// Adds an unsettled one-row forward's excess over its band's settled one-row forward
    /// to the tail's, once the band has `switch_base` of them.
    fn read_excess(&mut self, context_len: i64, seconds: f64) {
        let base = &self.obs[self.cell(self.band(context_len), 1)];
        if base.is_empty() || base.len() < self.policy.switch_base {
            return;
        }
        let settled = self.prior.seconds(1, context_len) * self.shrunk(base.iter().copied()).exp();
        if let Some(t) = self.tail.as_mut() {
            t.excess += seconds / settled - 1.0;
            t.measured = true;
        }
    }

    /// Ends the unsettled one-row forwards: a draft's measured excess joins the switch's.
    fn close_tail(&mut self) {
        let Some(t) = self.tail.take() else { return };
        if !(t.charged && t.measured) {
            return;
        }
        if self.switch.len() == self.policy.window {
            self.switch.pop_front();
        }
        self.switch.push_back(t.excess);
        self.switch_frac = self.shrunk(self.switch.iter().copied()).max(0.0);
    }

    /// The next forward measured follows a prompt, not the last one measured.
    pub fn gap(&mut self) {
        self.close_tail();
        self.tail = Some(Tail::new(false, self.policy.settle));
    }

    /// The log-ratio by rows (index 0 unused) of `band`: its measured row counts' shrunk
    /// medians interpolated in rows, or all bands' pooled where it has none, or 0.
    fn log_ratios(&self, band: usize, out: &mut Vec<f64>) {
        let rows = self.max_rows() + 1;
        let mine: Vec<usize> = (1..rows)
            .filter(|&r| !self.obs[self.cell(band, r)].is_empty())
            .collect();
        let (at, vals): (Vec<f64>, Vec<f64>) = if !mine.is_empty() {
            mine.iter()
                .map(|&r| {
                    (
                        r as f64,
                        self.shrunk(self.obs[self.cell(band, r)].iter().copied()),
                    )
                })
                .unzip()
        } else {
            (1..rows)
                .filter_map(|r| {
                    let all = (0..self.policy.bands.len()).flat_map(|b| &self.obs[self.cell(b, r)]);
                    (all.clone().next().is_some()).then(|| (r as f64, self.shrunk(all.copied())))
                })
                .unzip()
        };
        out.clear();
        if at.is_empty() {
            out.resize(rows, 0.0);
        } else {
            out.extend((0..rows).map(|r| interp(r as f64, &at, &vals)));
        }
    }

    /// Seconds of a forward of r rows over `context_len` cached tokens at index r (index 0
    /// NaN), up to the prior's widest row: the prior corrected by what was measured, read at
    /// the context's 16-token bucket and band, no row count cheaper than one row.
    pub fn curve(&mut self, context_len: i64) -> &[f64] {
        let b = bucket(context_len);
        if self.curve_bucket != Some(b) {
            let mut ratios = Vec::with_capacity(self.max_rows() + 1);
            self.log_ratios(self.band(b), &mut ratios);
            let mut out = std::mem::take(&mut self.curve);
            self.prior.curve_into(b, &mut out);
            for (x, r) in out.iter_mut().zip(&ratios).skip(1) {
                *x *= r.exp();
            }
            let one = out[1];
            for x in out.iter_mut().skip(2) {
                *x = x.max(one);
            }
            self.curve = out;
            self.curve_bucket = Some(b);
        }
        &self.curve
    }

    /// `(rows, median seconds, forwards kept)` for each row count measured in
    /// `context_len`'s band, the seconds read against the prior at `context_len`.
    pub fn measured(&self, context_len: i64) -> Vec<(usize, f64, usize)> {
        let band = self.band(context_len);
        let mut prior = Vec::new();
        self.prior.curve_into(context_len, &mut prior);
        (1..=self.max_rows())
            .filter_map(|r| {
                let v = &self.obs[self.cell(band, r)];
                (!v.is_empty()).then(|| (r, prior[r] * median(v.iter().copied()).exp(), v.len()))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(switches: bool) -> Policy {
        Policy {
            bands: vec![0, 256, 512, 1024],
            window: 15,
            prior_count: 2.0,
            switch_base: 3,
            settle: 2,
            switches,
        }
    }

    #[test]
    fn grid_interpolates_rows_and_contexts() {
        let g = CostGrid::new(&[1, 2, 4], &[128, 1024], &[1.0, 1.2, 1.4, 2.0, 2.2, 2.4]).unwrap();
        let mut c = Vec::new();
        g.curve_into(0, &mut c);
        assert!(c[0].is_nan());
        let want = [1.0, 1.2, 1.3, 1.4];
        assert!(c[1..].iter().zip(want).all(|(x, y)| (x - y).abs() < 1e-12));
        g.curve_into(576 + 7, &mut c); // bucket 576: halfway
        assert!((c[1] - 1.5).abs() < 1e-12 && (c[4] - 1.9).abs() < 1e-12);
        g.curve_into(1920, &mut c); // past the longest: extrapolated from the last two
        assert!((c[1] - 3.0).abs() < 1e-12);
        assert!(CostGrid::new(&[2, 4], &[0], &[1.0, 1.0]).is_err());
        assert!(CostGrid::new(&[1, 2], &[0], &[1.0, -1.0]).is_err());
        assert!(CostGrid::new(&[1, 2], &[5, 5], &[1.0; 4]).is_err());
    }

    #[test]
    fn learns_the_median_and_keeps_switches_apart() {
        let g = CostGrid::new(&[1, 8], &[0], &[0.1, 0.8]).unwrap();
        let mut l = LearnedCosts::new(g, policy(true)).unwrap();
        for _ in 0..45 {
            for _ in 0..4 {
                l.observe(1, 300, 0.1); // the first two of all follow the prompt: unsettled
            }
            l.observe(8, 300, 0.3);
            l.observe(1, 300, 0.15); // after 8 rows: 0.5 and 0.2 of a one-row forward more
            l.observe(1, 300, 0.12);
            l.observe(1, 300, 0.1); // settled again
        }
        let c = l.curve(300).to_vec();
        assert!((c[1] - 0.1).abs() < 1e-12, "{c:?}");
        let want8 = 0.8 * ((0.3f64 / 0.8).ln() * 15.0 / 17.0).exp();
        assert!((c[8] - want8).abs() < 1e-12, "{c:?}");
        // The first draft's tail came before its band had 3 settled forwards: not read.
        assert_eq!(l.switches_kept(), 15);
        assert!((l.switch_frac() - 0.7 * 15.0 / 17.0).abs() < 1e-12);
        // A wider forward or a prompt ends a tail early: what it saw so far counts.
        l.observe(8, 300, 0.3);
        l.observe(1, 300, 0.15);
        l.gap();
        l.observe(1, 300, 5.0); // after the prompt: neither settled nor a draft's
        l.observe(1, 300, 5.0);
        assert!((l.curve(300)[1] - 0.1).abs() < 1e-12);
        // The median of 14 0.7s and a 0.5.
        assert!((l.switch_frac() - 0.7 * 15.0 / 17.0).abs() < 1e-12);
        // Without switches, every one-row forward counts as one.
        let mut m = LearnedCosts::new(
            CostGrid::new(&[1, 8], &[0], &[0.1, 0.8]).unwrap(),
            policy(false),
        )
        .unwrap();
        m.observe(8, 300, 0.3);
        m.observe(1, 300, 0.2);
        assert!(m.curve(300)[1] > 0.1 && m.switch_frac() == 0.0);
        assert!(LearnedCosts::new(
            CostGrid::new(&[1], &[0], &[0.1]).unwrap(),
            Policy {
                settle: 0,
                ..policy(true)
            }
        )
        .is_err());
        // Another band borrows what all bands saw; bad forwards are ignored.
        let n = l.count();
        l.observe(4, 3000, f64::NAN);
        l.observe(9, 3000, 0.1);
        assert_eq!(l.count(), n);
        assert!((l.curve(3000)[1] - 0.1).abs() < 1e-9);
        assert_eq!(l.measured(300)[0].2, 15);
    }
}
