//! The PyO3 binding layer: module `lookahead._core`. Arguments are checked and converted here
//! (`args.rs`), so the Python wrapper (python/lookahead/cache.py) passes them straight through.

mod args;
mod cache;
mod costs;
mod draft;
mod errors;
mod sizing;

use pyo3::prelude::*;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<cache::PyCache>()?;
    m.add_class::<draft::PyDraft>()?;
    m.add_function(wrap_pyfunction!(errors::_error_kinds, m)?)?;
    m.add_function(wrap_pyfunction!(errors::_raise_error, m)?)?;
    m.add_function(wrap_pyfunction!(cache::_panic_for_test, m)?)?;
    m.add_function(wrap_pyfunction!(cache::_time_index, m)?)?;
    m.add_function(wrap_pyfunction!(cache::_time_compaction, m)?)?;
    m.add_class::<sizing::PyCalibration>()?;
    m.add_class::<costs::PyLearnedCosts>()?;
    m.add_class::<costs::PyCostGrid>()?;
    m.add_function(wrap_pyfunction!(sizing::outcomes, m)?)?;
    // The one source of the knobs' defaults and bounds: the wrapper, the CLI, the SGLang
    // config and the docs' test read these.
    m.add(
        "DEFAULTS",
        cache::config_dict(m.py(), &crate::cache::Config::default())?,
    )?;
    m.add("MAX_BUDGET", crate::cache::MAX_BUDGET)?;
    m.add("MAX_DEPTH", crate::cache::MAX_DEPTH)?;
    m.add("MAX_WEIGHT", crate::cache::MAX_WEIGHT)?;
    m.add("MAX_CAPACITY_NODES", crate::cache::MAX_CAPACITY_NODES)?;
    m.add("MIN_CAPACITY_BYTES", crate::cache::MIN_CAPACITY_BYTES)?;
    m.add("MAX_INDEX_THREADS", crate::cache::MAX_INDEX_THREADS)?;
    m.add("MAX_RECYCLE_K", crate::recycle::MAX_WIDTH)?;
    m.add("MAX_RECYCLE_SLOTS", crate::cache::MAX_RECYCLE_SLOTS)?;
    m.add("MAX_IDS_PER_CALL", args::MAX_IDS_PER_CALL)?;
    m.add("MAX_CORPORA", crate::cache::MAX_CORPORA)?;
    m.add("MAX_CORPUS_ID_BYTES", crate::cache::MAX_CORPUS_ID_BYTES)?;
    m.add("CORPUS_SHARE", crate::cache::CORPUS_SHARE)?;
    Ok(())
}
