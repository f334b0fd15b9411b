//! `lookahead._core.LearnedCosts`: what verify forwards cost, learnt from the engine's own
//! forwards (crate::learned_costs), for `lookahead.learned_costs`. A Python subclass
//! (`lookahead.learned_costs.LearnedCosts`) gives it its policy and its prior. And
//! `lookahead._core.CostGrid`: a measured curve read at a context, for
//! `lookahead.costs.CostModel`.

use numpy::PyArray1;
use pyo3::prelude::*;

use super::errors::to_pyerr;
use super::sizing::{floats, ints};
use crate::learned_costs::{CostGrid, LearnedCosts, Policy};

/// A forward's seconds by rows and context, as measured at some of each.
#[pyclass(name = "CostGrid", module = "lookahead._core", frozen)]
pub struct PyCostGrid {
    inner: CostGrid,
}

#[pymethods]
impl PyCostGrid {
    /// The grid of `widths` (rising from 1), `contexts` (rising from >= 0) and `seconds`
    /// (`[context][width]` flattened, each positive and finite), or InvalidInput.
    #[new]
    fn new(
        py: Python<'_>,
        widths: Bound<'_, PyAny>,
        contexts: Bound<'_, PyAny>,
        seconds: Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let widths: Vec<usize> = ints(&widths)?
            .into_iter()
            .map(|w| usize::try_from(w).unwrap_or(0))
            .collect();
        let inner = CostGrid::new(&widths, &ints(&contexts)?, &floats(&seconds)?)
            .map_err(|e| to_pyerr(py, e))?;
        Ok(PyCostGrid { inner })
    }

    /// Seconds of a forward of r rows over `context_len` cached tokens at index r (index 0
    /// NaN), up to the widest width: linear between widths, and between contexts (past the
    /// longest, extrapolated from the last two, never below the shortest's), read at the
    /// context's 16-token bucket.
    fn curve<'py>(&self, py: Python<'py>, context_len: i64) -> Bound<'py, PyArray1<f64>> {
        let grid = &self.inner;
        let out = py.detach(|| {
            let mut out = Vec::with_capacity(grid.max_rows() + 1);
            grid.curve_into(context_len, &mut out);
            out
        });
        PyArray1::from_vec(py, out)
    }
}

/// Forward seconds by rows and context, learnt from measured forwards around a prior grid.
#[pyclass(name = "LearnedCosts", module = "lookahead._core", subclass)]
pub struct PyLearnedCosts {
    inner: LearnedCosts,
}

#[pymethods]
impl PyLearnedCosts {
    /// The prior: a forward's seconds by rows and context as measured (`prior`, a
    /// `CostGrid`, copied); the policy: context `bands` (lower edges, rising from 0), the
    /// `window` of forwards kept per band and rows, the prior worth `prior_count` forwards,
    /// `switch_base` one-row forwards of a band before a switch is read against them,
    /// `settle` one-row forwards after a wider one (or a prompt) before they count as
    /// settled, and whether to keep `switches` apart.
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        prior: PyRef<'_, PyCostGrid>,
        bands: Bound<'_, PyAny>,
        window: i64,
        prior_count: f64,
        switch_base: usize,
        settle: usize,
        switches: bool,
    ) -> PyResult<Self> {
        let policy = Policy {
            bands: ints(&bands)?,
            // A negative window is refused by the core's check, as 0 is.
            window: usize::try_from(window).unwrap_or(0),
            prior_count,
            switch_base,
            settle,
            switches,
        };
        let inner = LearnedCosts::new(prior.inner.clone(), policy).map_err(|e| to_pyerr(py, e))?;
        Ok(PyLearnedCosts { inner })
    }

    /// The widest row count the prior reaches.
    #[getter]
    fn max_rows(&self) -> usize {
        self.inner.max_rows()
    }

    /// Forwards kept per context band and row count (the median of this many).
    #[getter]
    fn window(&self) -> usize {
        self.inner.policy().window
    }

    /// Whether the one-row forwards right after a wider one are kept apart (`switch_frac`;
    /// settable: it applies to the forwards observed from then on).
    #[getter]
    fn switches(&self) -> bool {
        self.inner.policy().switches
    }

    #[setter]
    fn set_switches(&mut self, on: bool) {
        self.inner.set_switches(on);
    }

    /// Forwards measured in all.
    #[getter]
    fn count(&self) -> u64 {
        self.inner.count()
    }

    /// What a wider forward adds to the one-row forwards after it until they settle, as a
    /// fraction of a settled one-row forward.
    #[getter]
    fn switch_frac(&self) -> f64 {
        self.inner.switch_frac()
    }

    /// Wider forwards' excesses kept (the last `window`).
    #[getter]
    fn switches_kept(&self) -> usize {
        self.inner.switches_kept()
    }

    /// The context band of `context_len` cached tokens.
    fn band(&self, context_len: i64) -> usize {
        self.inner.band(context_len)
    }

    /// One forward of `rows` rows over `context_len` cached tokens took `seconds` (ignored when
    /// the prior does not reach `rows`, or `seconds` is not a positive time).
    fn observe(&mut self, rows: i64, context_len: i64, seconds: f64) {
        self.inner.observe(rows, context_len, seconds);
    }

    /// The next forward measured follows a prompt, not the last one measured.
    fn gap(&mut self) {
        self.inner.gap();
    }

    /// Seconds of a forward of r rows over `context_len` cached tokens at index r (index 0
    /// NaN), up to `max_rows`.
    fn curve<'py>(&mut self, py: Python<'py>, context_len: i64) -> Bound<'py, PyArray1<f64>> {
        let inner = &mut self.inner;
        PyArray1::from_vec(py, py.detach(|| inner.curve(context_len).to_vec()))
    }

    /// `[(rows, median seconds, forwards kept)]` measured in `context_len`'s band.
    fn measured(&self, context_len: i64) -> Vec<(usize, f64, usize)> {
        self.inner.measured(context_len)
    }
}
