//! `expected_lengths` and `choose_prefix`: the cost-aware sizer's per-step arithmetic
//! (crate::sizing) for `lookahead.calibration` and `lookahead.sizing`.

use numpy::{PyArray1, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::prelude::*;

use super::errors::to_pyerr;
use crate::error::Result;
use crate::sizing::{self, ChanceTable};

/// A draft and the chance table it is read against, as Python passes them in one tuple
/// (`AcceptanceCalibration.native_args`): `chances` [groups, bands] float64, `bands` float64
/// and `groups` int64 lower edges, `scores` float64, `parents` int32 (0 the root, j node
/// j - 1), `matched` uint8, each C-contiguous (else TypeError from numpy).
#[derive(FromPyObject)]
pub struct DraftArrays<'py>(
    PyReadonlyArray2<'py, f64>,
    PyReadonlyArray1<'py, f64>,
    PyReadonlyArray1<'py, i64>,
    PyReadonlyArray1<'py, f64>,
    PyReadonlyArray1<'py, i32>,
    PyReadonlyArray1<'py, u8>,
);

/// The same arrays as slices.
struct Draft<'a> {
    table: ChanceTable<'a>,
    scores: &'a [f64],
    parents: &'a [i32],
    matched: &'a [u8],
}

impl DraftArrays<'_> {
    fn slices(&self) -> PyResult<Draft<'_>> {
        Ok(Draft {
            table: ChanceTable {
                chances: self.0.as_slice()?,
                bands: self.1.as_slice()?,
                groups: self.2.as_slice()?,
            },
            scores: self.3.as_slice()?,
            parents: self.4.as_slice()?,
            matched: self.5.as_slice()?,
        })
    }
}

fn expected(d: &Draft<'_>, out: &mut Vec<f64>) -> Result<()> {
    d.table.check()?;
    sizing::expected_lengths(&d.table, d.scores, d.parents, d.matched, out)
}

/// Expected accepted length of each best-first prefix of a draft without its root
/// (`AcceptanceCalibration.expected`). InvalidInput on a bad shape or a parent after its
/// child.
#[pyfunction]
pub fn expected_lengths<'py>(
    py: Python<'py>,
    draft: DraftArrays<'py>,
) -> PyResult<Bound<'py, PyArray1<f64>>> {
    let d = draft.slices()?;
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
pub fn choose_prefix<'py>(
    py: Python<'py>,
    draft: DraftArrays<'py>,
    costs: PyReadonlyArray1<'py, f64>,
    host_s: f64,
    switch_s: f64,
) -> PyResult<usize> {
    let d = draft.slices()?;
    let costs = costs.as_slice()?;
    py.detach(|| {
        let mut out = Vec::with_capacity(d.scores.len());
        expected(&d, &mut out)?;
        Ok(sizing::choose_nodes(&out, costs, host_s, switch_s))
    })
    .map_err(|e| to_pyerr(py, e))
}
