//! `lookahead._core.Calibration`: the acceptance calibration (crate::calibration) and the
//! cost-aware cut read off it (crate::sizing), for `lookahead.calibration` and
//! `lookahead.sizing`. A Python subclass (`AcceptanceCalibration`) gives it its policy.

use numpy::{Element, PyArray1, PyArray2, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyList;

use super::errors::to_pyerr;
use crate::calibration::Calibration;
use crate::error::{Error, Result};
use crate::sizing;

/// Integers from a 1-D numpy array of int32, int64 or uint8 (a draft's dtypes, read
/// directly, strided or not), of float64 (truncated towards 0, as numpy's `astype` reads it:
/// the cut's inputs were converted so before the core took them over), or from a list or any
/// other sequence of ints. Each kind is tried by a type check, not by a failed conversion: a
/// step calls this six times right after a forward.
pub fn ints(obj: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    if let Ok(l) = obj.cast::<PyList>() {
        return l.iter().map(|x| x.extract::<i64>()).collect();
    }
    if let Ok(a) = obj.cast::<PyArray1<i32>>() {
        return Ok(read(a).map(i64::from).collect());
    }
    if let Ok(a) = obj.cast::<PyArray1<u8>>() {
        return Ok(read(a).map(i64::from).collect());
    }
    if let Ok(a) = obj.cast::<PyArray1<i64>>() {
        return Ok(read(a).collect());
    }
    if let Ok(a) = obj.cast::<PyArray1<f64>>() {
        return Ok(read(a).map(|x| x as i64).collect());
    }
    obj.extract::<Vec<i64>>()
}

/// Floats from a 1-D numpy array of float32 (a draft's scores) or float64, read directly, or
/// from any other sequence of numbers.
pub fn floats(obj: &Bound<'_, PyAny>) -> PyResult<Vec<f64>> {
    if let Ok(a) = obj.cast::<PyArray1<f32>>() {
        return Ok(read(a).map(f64::from).collect());
    }
    if let Ok(a) = obj.cast::<PyArray1<f64>>() {
        return Ok(read(a).collect());
    }
    obj.extract::<Vec<f64>>()
}

/// Truth values from a 1-D numpy array of bools, read directly, or from any numbers (0 is
/// false).
fn bools(obj: &Bound<'_, PyAny>) -> PyResult<Vec<bool>> {
    if let Ok(a) = obj.cast::<PyArray1<bool>>() {
        return Ok(read(a).collect());
    }
    Ok(floats(obj)?.iter().map(|&x| x != 0.0).collect())
}

/// The elements of a 1-D array, copied at once while the GIL is held (no borrow is kept).
fn read<T: Element + Copy>(a: &Bound<'_, PyArray1<T>>) -> impl Iterator<Item = T> {
    let v = a.to_vec().unwrap_or_else(|_| a.to_owned_array().to_vec());
    v.into_iter()
}

/// A draft without its root as the cut reads it: path scores, parents (0 the root, j node
/// j - 1), matched.
fn draft(
    scores: &Bound<'_, PyAny>,
    parents: &Bound<'_, PyAny>,
    matched: &Bound<'_, PyAny>,
) -> PyResult<Draft> {
    let parents = ints(parents)?;
    let parents = parents
        .iter()
        .map(|&p| i32::try_from(p).unwrap_or(-1))
        .collect();
    let matched = ints(matched)?;
    let matched = matched.iter().map(|&m| m.clamp(0, 255) as u8).collect();
    Ok(Draft {
        scores: floats(scores)?,
        parents,
        matched,
    })
}

/// A node's table cells: `(groups, bands)`.
type Cells<'py> = (Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<i64>>);

struct Draft {
    scores: Vec<f64>,
    parents: Vec<i32>,
    matched: Vec<u8>,
}

/// The acceptance calibration: counts of draft nodes offered and followed per score band and
/// match group, faded by age, and the chance table they give (non-decreasing in the score).
#[pyclass(name = "Calibration", module = "lookahead._core", subclass)]
pub struct PyCalibration {
    inner: Calibration,
}

/// `then` of the draft's expected lengths under the calibration's table as it stands, both
/// worked out without the GIL.
fn with_expected<R: Send>(
    py: Python<'_>,
    cal: &mut Calibration,
    d: &Draft,
    then: impl FnOnce(Vec<f64>) -> R + Send,
) -> PyResult<R> {
    py.detach(|| -> Result<R> {
        let mut out = Vec::with_capacity(d.scores.len());
        let table = cal.table();
        sizing::expected_lengths(&table, &d.scores, &d.parents, &d.matched, &mut out)?;
        Ok(then(out))
    })
    .map_err(|e| to_pyerr(py, e))
}

impl PyCalibration {
    /// The `(group, band)` of each node (`Calibration::locate`).
    fn locate(
        &self,
        py: Python<'_>,
        cond: &Bound<'_, PyAny>,
        matched: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<(i64, i64)>> {
        let (c, m) = (floats(cond)?, ints(matched)?);
        if c.len() != m.len() {
            return Err(to_pyerr(
                py,
                Error::InvalidInput(format!(
                    "cond and matched must have one length, got {} and {}",
                    c.len(),
                    m.len()
                )),
            ));
        }
        c.iter()
            .zip(&m)
            .map(|(&c, &m)| {
                let (g, b) = self.inner.locate(c, m).map_err(|e| to_pyerr(py, e))?;
                Ok((g as i64, b as i64))
            })
            .collect()
    }

    fn grid<'py>(&self, py: Python<'py>, v: &[f64]) -> PyResult<Bound<'py, PyArray2<f64>>> {
        let (g, b) = self.inner.shape();
        let rows: Vec<Vec<f64>> = v.chunks(b).take(g).map(<[f64]>::to_vec).collect();
        Ok(PyArray2::from_vec2(py, &rows)?)
    }
}

#[pymethods]
impl PyCalibration {
    /// `bands`: the score bands' lower edges (ascending, from 0, below 1); `groups`: the match
    /// groups' lower edges (ascending); the prior (each band's middle score) worth
    /// `prior_weight` nodes per cell; `decay` the fading per step, in (0, 1].
    #[new]
    fn new(
        py: Python<'_>,
        bands: Bound<'_, PyAny>,
        groups: Bound<'_, PyAny>,
        prior_weight: f64,
        decay: f64,
    ) -> PyResult<Self> {
        let inner = Calibration::new(&floats(&bands)?, &ints(&groups)?, prior_weight, decay)
            .map_err(|e| to_pyerr(py, e))?;
        Ok(PyCalibration { inner })
    }

    /// The prior's weight in nodes per cell (settable: the table follows).
    #[getter]
    fn prior_weight(&self) -> f64 {
        self.inner.prior_weight()
    }

    #[setter]
    fn set_prior_weight(&mut self, py: Python<'_>, w: f64) -> PyResult<()> {
        self.inner.set_prior_weight(w).map_err(|e| to_pyerr(py, e))
    }

    #[getter]
    fn decay(&self) -> f64 {
        self.inner.decay()
    }

    /// `[band]`: the prior's chance, each score band's middle score.
    #[getter]
    fn prior<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<f64>> {
        PyArray1::from_slice(py, self.inner.prior())
    }

    /// `[group, band]`: nodes offered, faded by age.
    #[getter]
    fn offered<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f64>>> {
        self.grid(py, self.inner.offered())
    }

    /// `[group, band]`: of them followed, faded alike.
    #[getter]
    fn accepted<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f64>>> {
        self.grid(py, self.inner.accepted())
    }

    /// `[group, band]`: the chance that the target follows a node, non-decreasing in the band.
    fn table<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f64>>> {
        let t = self.inner.table().chances.to_vec();
        self.grid(py, &t)
    }

    /// `(groups, bands)`: the table's cell of each node of conditional score `cond[i]`
    /// continuing a match of `matched[i]` tokens (InvalidInput on a NaN score).
    fn cells<'py>(
        &self,
        py: Python<'py>,
        cond: Bound<'_, PyAny>,
        matched: Bound<'_, PyAny>,
    ) -> PyResult<Cells<'py>> {
        let (g, b) = self
            .locate(py, &cond, &matched)?
            .into_iter()
            .unzip::<_, _, Vec<_>, Vec<_>>();
        Ok((PyArray1::from_vec(py, g), PyArray1::from_vec(py, b)))
    }

    /// The chance that the target follows each node of conditional score `cond[i]` continuing
    /// a match of `matched[i]` tokens, where it accepted the node's parent (the table's cell).
    fn predict<'py>(
        &mut self,
        py: Python<'py>,
        cond: Bound<'_, PyAny>,
        matched: Bound<'_, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<f64>>> {
        let at = self.locate(py, &cond, &matched)?;
        let nb = self.inner.shape().1;
        let t = self.inner.table().chances;
        let out = at
            .iter()
            .map(|&(g, b)| t[g as usize * nb + b as usize])
            .collect();
        Ok(PyArray1::from_vec(py, out))
    }

    /// One verify step's nodes whose parent the target accepted: their conditional scores,
    /// `matched`, and whether it followed each (bools, or numbers: 0 is false). Earlier
    /// counts fade first.
    fn observe(
        &mut self,
        py: Python<'_>,
        cond: Bound<'_, PyAny>,
        matched: Bound<'_, PyAny>,
        followed: Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let (c, m) = (floats(&cond)?, ints(&matched)?);
        let f = bools(&followed)?;
        self.inner.observe(&c, &m, &f).map_err(|e| to_pyerr(py, e))
    }

    /// Learns one verify step of a draft: `tokens`, `parents`, path `scores` and `matched` of
    /// the whole tree before the cut (root first), the accepted `path` (root first) and the
    /// step's `emitted` tokens; `verified` the verified nodes (root included) when the step
    /// sampled, None when greedy. Returns what the draft accepted (greedy: one more where a
    /// cut child of the last accepted node would have been accepted).
    #[pyo3(signature = (tokens, parents, scores, matched, path, emitted, verified=None))]
    #[allow(clippy::too_many_arguments)]
    fn learn(
        &mut self,
        py: Python<'_>,
        tokens: Bound<'_, PyAny>,
        parents: Bound<'_, PyAny>,
        scores: Bound<'_, PyAny>,
        matched: Bound<'_, PyAny>,
        path: Bound<'_, PyAny>,
        emitted: Bound<'_, PyAny>,
        verified: Option<usize>,
    ) -> PyResult<usize> {
        let (t, p, s, m) = (
            ints(&tokens)?,
            ints(&parents)?,
            floats(&scores)?,
            ints(&matched)?,
        );
        let (path, emitted) = (ints(&path)?, ints(&emitted)?);
        let inner = &mut self.inner;
        py.detach(|| inner.learn(&t, &p, &s, &m, &path, &emitted, verified))
            .map_err(|e| to_pyerr(py, e))
    }

    /// Expected accepted length of each best-first prefix of a draft without its root
    /// (`scores[i]` node i's path score, `parents[i]` its parent, 0 the root and j node
    /// j - 1, `matched[i]` its match): `[k - 1]` for the first k nodes. InvalidInput on a
    /// parent after its child or a NaN score.
    fn expected<'py>(
        &mut self,
        py: Python<'py>,
        scores: Bound<'_, PyAny>,
        parents: Bound<'_, PyAny>,
        matched: Bound<'_, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<f64>>> {
        let d = draft(&scores, &parents, &matched)?;
        let out = with_expected(py, &mut self.inner, &d, |out| out)?;
        Ok(PyArray1::from_vec(py, out))
    }

    /// How many of the draft's nodes to verify (`lookahead.sizing.choose_nodes` over
    /// `expected`): `costs` a forward's seconds by rows (index 0 unused), `host_s` the step's
    /// other seconds, `switch_s` what verifying any draft adds besides (to the forwards after).
    #[allow(clippy::too_many_arguments)]
    fn choose(
        &mut self,
        py: Python<'_>,
        scores: Bound<'_, PyAny>,
        parents: Bound<'_, PyAny>,
        matched: Bound<'_, PyAny>,
        costs: Bound<'_, PyAny>,
        host_s: f64,
        switch_s: f64,
    ) -> PyResult<usize> {
        let (d, costs) = (draft(&scores, &parents, &matched)?, floats(&costs)?);
        with_expected(py, &mut self.inner, &d, |out| {
            sizing::choose_nodes(&out, &costs, host_s, switch_s)
        })
    }
}

/// What a verify step says of a draft's nodes whose parent it accepted
/// (crate::calibration::outcomes): `(nodes, followed)`.
#[pyfunction]
#[pyo3(signature = (tokens, parents, path, emitted, verified=None))]
pub fn outcomes(
    py: Python<'_>,
    tokens: Bound<'_, PyAny>,
    parents: Bound<'_, PyAny>,
    path: Bound<'_, PyAny>,
    emitted: Bound<'_, PyAny>,
    verified: Option<usize>,
) -> PyResult<(Vec<usize>, Vec<f64>)> {
    let (mut nodes, mut followed) = (Vec::new(), Vec::new());
    crate::calibration::outcomes(
        &ints(&tokens)?,
        &ints(&parents)?,
        &ints(&path)?,
        &ints(&emitted)?,
        verified,
        &mut nodes,
        &mut followed,
    )
    .map_err(|e| to_pyerr(py, e))?;
    let followed = followed.iter().map(|&f| f64::from(u8::from(f))).collect();
    Ok((nodes, followed))
}
