//! `expected_lengths` and `choose_prefix`: the cost-aware sizer's per-step arithmetic
//! (crate::sizing) for `lookahead.calibration` and `lookahead.sizing`.

use numpy::{PyArray1, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::prelude::*;

use super::errors::to_pyerr;
use crate::error::Result;
use crate::sizing::{self, ChanceTable};

/// The arrays of one call, borrowed from numpy (C-contiguous, else TypeError from numpy).
struct Draft<'a> {
    table: ChanceTable<'a>,
    scores: &'a [f64],
    parents: &'a [i32],
    matched: &'a [u8],
}

fn expected(d: &Draft<'_>, out: &mut Vec<f64>) -> Result<()> {
    d.table.check()?;
    sizing::expected_lengths(&d.table, d.scores, d.parents, d.matched, out)
}

/// Expected accepted length of each best-first prefix of a draft without its root
/// (`AcceptanceCalibration.expected`): `chances` [groups, bands] float64, `bands` float64 and
/// `groups` int64 lower edges, `scores` float64, `parents` int32 (0 the root, j node j - 1),
/// `matched` uint8. InvalidInput on a bad shape or a parent after its child.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn expected_lengths<'py>(
    py: Python<'py>,
    chances: PyReadonlyArray2<'py, f64>,
    bands: PyReadonlyArray1<'py, f64>,
    groups: PyReadonlyArray1<'py, i64>,
    scores: PyReadonlyArray1<'py, f64>,
    parents: PyReadonlyArray1<'py, i32>,
    matched: PyReadonlyArray1<'py, u8>,
) -> PyResult<Bound<'py, PyArray1<f64>>> {
    let d = Draft {
        table: ChanceTable {
            chances: chances.as_slice()?,
            bands: bands.as_slice()?,
            groups: groups.as_slice()?,
        },
        scores: scores.as_slice()?,
        parents: parents.as_slice()?,
        matched: matched.as_slice()?,
    };
    let mut out = Vec::new();
    py.detach(|| expected(&d, &mut out))
        .map_err(|e| to_pyerr(py, e))?;
    Ok(PyArray1::from_vec(py, out))
}

/// How many of the draft's nodes to verify (`lookahead.sizing.choose_nodes` over
/// `expected_lengths`): `costs` the forward's seconds by rows (index 0 unused), `host_s` the
/// step's other seconds, `switch_s` what verifying any draft adds besides (to the next
/// forward).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn choose_prefix<'py>(
    py: Python<'py>,
    chances: PyReadonlyArray2<'py, f64>,
    bands: PyReadonlyArray1<'py, f64>,
    groups: PyReadonlyArray1<'py, i64>,
    scores: PyReadonlyArray1<'py, f64>,
    parents: PyReadonlyArray1<'py, i32>,
    matched: PyReadonlyArray1<'py, u8>,
    costs: PyReadonlyArray1<'py, f64>,
    host_s: f64,
    switch_s: f64,
) -> PyResult<usize> {
    let d = Draft {
        table: ChanceTable {
            chances: chances.as_slice()?,
            bands: bands.as_slice()?,
            groups: groups.as_slice()?,
        },
        scores: scores.as_slice()?,
        parents: parents.as_slice()?,
        matched: matched.as_slice()?,
    };
    let costs = costs.as_slice()?;
    py.detach(|| {
        let mut out = Vec::with_capacity(d.scores.len());
        expected(&d, &mut out)?;
        Ok(sizing::choose_nodes(&out, costs, host_s, switch_s))
    })
    .map_err(|e| to_pyerr(py, e))
}
