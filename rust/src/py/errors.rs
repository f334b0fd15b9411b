//! The one place where core errors become Python exceptions (classes in lookahead/errors.py).

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

use crate::error::{Error, ERROR_KINDS};

/// The `lookahead.errors` class each variant raises. The match is exhaustive, so a new
/// variant does not compile until it is mapped; `tests/test_cache_api.py` raises each one.
pub fn exception_name(e: &Error) -> &'static str {
    match e {
        Error::InvalidInput(_) => "InvalidInput",
        Error::UnknownRequest(_) => "UnknownRequest",
        Error::RequestExists(_) => "RequestExists",
        Error::Io(_) => "PersistError",
        Error::NotFound(_) => "SaveFileNotFound",
        Error::Format(_) => "FileFormatError",
        Error::Invariant(_) => "InvariantError",
        Error::Internal(_) => "InternalError",
    }
}

static ERRORS_MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

fn class<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyType>> {
    let m = ERRORS_MODULE.get_or_try_init(py, || {
        PyModule::import(py, "lookahead.errors").map(Bound::unbind)
    })?;
    Ok(m.bind(py).getattr(name)?.cast_into::<PyType>()?)
}

pub fn to_pyerr(py: Python<'_>, e: Error) -> PyErr {
    match class(py, exception_name(&e)) {
        Ok(cls) => PyErr::from_type(cls, e.message().to_owned()),
        Err(import_err) => PyRuntimeError::new_err(format!(
            "{e} (and lookahead.errors failed to import: {import_err})"
        )),
    }
}

/// `[(variant, exception class name)]` for every variant.
#[pyfunction]
pub fn _error_kinds() -> Vec<(&'static str, &'static str)> {
    ERROR_KINDS
        .iter()
        .map(|k| {
            let e = Error::of_kind(k, String::new()).expect("ERROR_KINDS lists known kinds");
            (*k, exception_name(&e))
        })
        .collect()
}

/// Raises the exception of variant `kind` with `message` (for the mapping test).
#[pyfunction]
pub fn _raise_error(py: Python<'_>, kind: &str, message: String) -> PyResult<()> {
    match Error::of_kind(kind, message) {
        Some(e) => Err(to_pyerr(py, e)),
        None => Err(to_pyerr(
            py,
            Error::InvalidInput(format!("unknown error kind {kind:?}")),
        )),
    }
}
