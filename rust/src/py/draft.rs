//! `lookahead.Draft`: the draft tree of one request, made here for every `draft` / `step` call
//! (a native class: a frozen dataclass's `__init__` alone cost 1.5 µs, as much as the draft).

use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::draft::DraftTree;

/// A draft tree for one request; node 0 is the root (the context's last token).
///
/// `tokens`, `parents` (int32, `parents[0] == -1`, `parents[i] < i`), `scores` (float32,
/// estimated path probability, 1.0 at the root) and `matched` (uint8, the length of the
/// n-gram each node continues; 0 at the root and for a recycled prediction) all have length
/// `num_nodes`. A `Draft` built without `matched` reports zeros.
#[pyclass(name = "Draft", module = "lookahead._core", frozen, get_all)]
pub struct PyDraft {
    tokens: Py<PyAny>,
    parents: Py<PyAny>,
    scores: Py<PyAny>,
    num_nodes: usize,
    matched: Py<PyAny>,
}

#[pymethods]
impl PyDraft {
    #[new]
    #[pyo3(signature = (tokens, parents, scores, num_nodes, matched=None))]
    fn new(
        py: Python<'_>,
        tokens: Py<PyAny>,
        parents: Py<PyAny>,
        scores: Py<PyAny>,
        num_nodes: usize,
        matched: Option<Py<PyAny>>,
    ) -> Self {
        let matched = matched.unwrap_or_else(|| {
            PyArray1::<u8>::zeros(py, num_nodes, false)
                .into_any()
                .unbind()
        });
        PyDraft {
            tokens,
            parents,
            scores,
            num_nodes,
            matched,
        }
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "Draft(tokens={}, parents={}, scores={}, num_nodes={}, matched={})",
            self.tokens.bind(py).repr()?,
            self.parents.bind(py).repr()?,
            self.scores.bind(py).repr()?,
            self.num_nodes,
            self.matched.bind(py).repr()?,
        ))
    }

    /// Pickles (and copies) as `Draft(tokens, parents, scores, num_nodes, matched)`.
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let py = slf.py();
        let d = slf.get();
        let args = PyTuple::new(
            py,
            [
                d.tokens.clone_ref(py),
                d.parents.clone_ref(py),
                d.scores.clone_ref(py),
                d.num_nodes.into_pyobject(py)?.into_any().unbind(),
                d.matched.clone_ref(py),
            ],
        )?;
        Ok((slf.get_type().into_any(), args))
    }
}

/// The core's draft as a `Draft` of three fresh numpy arrays (owned by numpy, so no Rust
/// object has to live as their base).
pub fn to_py<'py>(py: Python<'py>, d: &DraftTree) -> PyResult<Bound<'py, PyDraft>> {
    // Ids >= 2**31 keep their bit pattern (view the array as uint32 to read them back).
    // SAFETY: u32 and i32 have the same size and alignment, and every bit pattern is valid.
    let tokens: &[i32] =
        unsafe { std::slice::from_raw_parts(d.tokens.as_ptr().cast(), d.tokens.len()) };
    Bound::new(
        py,
        PyDraft {
            tokens: PyArray1::from_slice(py, tokens).into_any().unbind(),
            parents: PyArray1::from_slice(py, &d.parents).into_any().unbind(),
            scores: PyArray1::from_slice(py, &d.scores).into_any().unbind(),
            num_nodes: d.num_nodes(),
            matched: PyArray1::from_slice(py, &d.matched).into_any().unbind(),
        },
    )
}
