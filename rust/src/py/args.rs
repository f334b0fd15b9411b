//! Arguments from Python: token ids, request ids, budgets, namespaces. Every check happens here,
//! once, and a bad value raises `lookahead.InvalidInput` with the argument's name.
//!
//! Token ids come as a list or tuple of ints (the engine's per-step case: ~20 ns per token), a
//! 1-D numpy array of any integer dtype (read in place, strided or not, one pass that converts
//! and range-checks), a torch tensor (`.detach().cpu().numpy()`), or another sequence of ints.

use numpy::{
    Element, PyArray1, PyArrayDescrMethods, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{
    PyBool, PyByteArray, PyBytes, PyInt, PyList, PyMemoryView, PySequence, PyString, PyTuple,
    PyType,
};

use super::errors::to_pyerr;
use crate::cache::{RequestId, MAX_BUDGET};
use crate::error::Error;

fn invalid(py: Python<'_>, msg: String) -> PyErr {
    to_pyerr(py, Error::InvalidInput(msg))
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// `numpy.integer`, the base class of numpy's integer scalars.
fn numpy_integer(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    static CLASS: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    CLASS.import(py, "numpy", "integer")
}

/// An int other than a bool: Python's (or a subclass) or a numpy integer scalar.
fn is_int(obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    if obj.is_exact_instance_of::<PyInt>() {
        return Ok(true);
    }
    if obj.is_instance_of::<PyBool>() {
        return Ok(false);
    }
    Ok(obj.is_instance_of::<PyInt>() || obj.is_instance(numpy_integer(obj.py())?)?)
}

/// `numpy.ma.MaskedArray`: its mask would be ignored by a read of the data.
fn masked_array(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    static CLASS: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    CLASS.import(py, "numpy.ma", "MaskedArray")
}

/// A str as UTF-8; a lone surrogate (which UTF-8 cannot hold) is a bad argument.
fn utf8(s: &Bound<'_, PyString>, what: &str) -> PyResult<String> {
    s.to_cow().map(|c| c.into_owned()).map_err(|_| {
        invalid(
            s.py(),
            format!("{what} must be valid Unicode text, got a str with a lone surrogate"),
        )
    })
}

/// A request id: an int (64-bit; numpy integers too) or a str. Bools are refused.
pub fn rid(obj: &Bound<'_, PyAny>) -> PyResult<RequestId> {
    let py = obj.py();
    if let Ok(s) = obj.cast_exact::<PyString>() {
        return Ok(RequestId::Str(utf8(s, "request id")?));
    }
    if is_int(obj)? {
        return obj
            .extract::<i64>()
            .map(RequestId::Int)
            .map_err(|_| invalid(py, format!("request id {obj} does not fit in 64 bits")));
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(RequestId::Str(utf8(s, "request id")?));
    }
    let what = if obj.is_instance_of::<PyBool>() {
        "a bool".to_owned()
    } else {
        type_name(obj)
    };
    Err(invalid(
        py,
        format!("request id must be an int or a str, got {what}"),
    ))
}

/// `obj` as an int in `[lo, hi]` (bools refused), named `name` in the error; `or_none` says
/// in the message that None is allowed too (the caller handles None).
fn int_in(obj: &Bound<'_, PyAny>, name: &str, lo: i64, hi: i64, or_none: bool) -> PyResult<i64> {
    let py = obj.py();
    let none = if or_none { " or None" } else { "" };
    if !is_int(obj)? {
        return Err(invalid(
            py,
            format!("{name} must be an int{none}, got {}", type_name(obj)),
        ));
    }
    match obj.extract::<i64>() {
        Ok(v) if (lo..=hi).contains(&v) => Ok(v),
        _ => Err(invalid(
            py,
            format!("{name} must be in [{lo}, {hi}]{none}, got {obj}"),
        )),
    }
}

/// A draft budget: an int in `[1, MAX_BUDGET]`.
pub fn budget(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    Ok(int_in(obj, "budget", 1, MAX_BUDGET as i64, false)? as usize)
}

/// An optional bound on a draft (`vocab`, `max_depth`): None, or an int in `[lo, hi]`.
pub fn bound(
    obj: Option<&Bound<'_, PyAny>>,
    name: &str,
    lo: i64,
    hi: i64,
) -> PyResult<Option<i64>> {
    obj.filter(|o| !o.is_none())
        .map(|o| int_in(o, name, lo, hi, true))
        .transpose()
}

/// `multi_branch`: a bool (Python's or numpy's); anything else is a likely mistake.
pub fn multi_branch(obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    obj.extract::<bool>().map_err(|_| {
        invalid(
            obj.py(),
            format!("multi_branch must be a bool, got {}", type_name(obj)),
        )
    })
}

/// A namespace name.
pub fn namespace(obj: &Bound<'_, PyAny>) -> PyResult<String> {
    match obj.cast::<PyString>() {
        Ok(s) => utf8(s, "namespace"),
        Err(_) => Err(invalid(
            obj.py(),
            format!("namespace must be a str, got {}", type_name(obj)),
        )),
    }
}

/// The most token ids one call takes (1 GiB of `u32`): a longer input, or a sequence whose
/// `len()` claims more, is refused before anything is allocated for it, so no input can make
/// the process abort on an allocation (`range(2**40)` once did).
pub const MAX_IDS_PER_CALL: usize = 1 << 28;

/// The most ids reserved ahead from a `len()` that is not backed by stored elements.
const TRUSTED_RESERVE: usize = 1 << 16;

fn too_many(py: Python<'_>, what: &str, n: impl std::fmt::Display) -> PyErr {
    invalid(
        py,
        format!("{what}: {n} token ids in one call; at most {MAX_IDS_PER_CALL} are taken"),
    )
}

fn check_count(py: Python<'_>, what: &str, n: usize) -> PyResult<()> {
    if n > MAX_IDS_PER_CALL {
        return Err(too_many(py, what, n));
    }
    Ok(())
}

/// Appends one id, growing `out` fallibly (an allocation failure is an error, not an abort).
fn push_id(out: &mut Vec<u32>, v: u32, py: Python<'_>, what: &str) -> PyResult<()> {
    if out.len() == out.capacity() {
        if out.len() >= MAX_IDS_PER_CALL {
            return Err(too_many(py, what, format!("more than {MAX_IDS_PER_CALL}")));
        }
        out.try_reserve(out.len().clamp(1024, MAX_IDS_PER_CALL - out.len()))
            .map_err(|e| invalid(py, format!("{what}: cannot allocate the ids: {e}")))?;
    }
    out.push(v);
    Ok(())
}

/// Token ids in `[0, 2**32)`, from any of the inputs the module docs list; `what` names the
/// argument in errors.
pub fn token_ids(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u32>> {
    let py = obj.py();
    if let Ok(list) = obj.cast_exact::<PyList>() {
        check_count(py, what, list.len())?;
        let mut out = Vec::with_capacity(list.len());
        for item in list.iter() {
            push_id(&mut out, token_id(&item, what)?, py, what)?;
        }
        return Ok(out);
    }
    if let Ok(tuple) = obj.cast_exact::<PyTuple>() {
        check_count(py, what, tuple.len())?;
        let mut out = Vec::with_capacity(tuple.len());
        for item in tuple.iter() {
            out.push(token_id(&item, what)?);
        }
        return Ok(out);
    }
    if let Ok(arr) = obj.cast::<PyUntypedArray>() {
        if obj.is_instance(masked_array(py)?)? {
            return Err(invalid(
                py,
                format!(
                    "{what}: a masked array's mask would be ignored; pass arr.compressed() or \
                     arr.filled(value)"
                ),
            ));
        }
        return array_ids(arr, what);
    }
    if obj.is_instance_of::<PyString>()
        || obj.is_instance_of::<PyBytes>()
        || obj.is_instance_of::<PyByteArray>()
        || obj.is_instance_of::<PyMemoryView>()
    {
        // Bytes are not token ids (a tokenizer's output is); refusing them catches text
        // passed where ids belong.
        return Err(invalid(
            py,
            format!(
                "{what} must be a sequence of ints or a 1-D integer array, got {}",
                type_name(obj)
            ),
        ));
    }
    if obj.hasattr("detach")? && obj.hasattr("numpy")? {
        // A torch tensor (any device): its CPU copy as a numpy array. Floating and complex
        // tensors (bf16 has no numpy dtype) are refused by their own flags first.
        for flag in ["is_floating_point", "is_complex"] {
            if obj.hasattr(flag)? && obj.call_method0(flag)?.is_truthy()? {
                let dtype = obj.getattr("dtype")?;
                return Err(invalid(
                    py,
                    format!("{what} must be integers, got a tensor of {dtype}"),
                ));
            }
        }
        let arr = obj
            .call_method0("detach")?
            .call_method0("cpu")?
            .call_method0("numpy")?;
        // Only an array goes on: an object whose `.numpy()` is itself must not recurse.
        return match arr.cast::<PyUntypedArray>() {
            Ok(arr) => array_ids(arr, what),
            Err(_) => Err(invalid(
                py,
                format!(
                    "{what}: .detach().cpu().numpy() gave a {}, not a numpy array",
                    type_name(&arr)
                ),
            )),
        };
    }
    match obj.cast::<PySequence>() {
        Ok(seq) if obj.hasattr("__len__")? => {
            // `len()` may be huge (a range) or untrue: reserve a bounded amount and grow as
            // the items come.
            let n = seq.len()?;
            check_count(py, what, n)?;
            let mut out = Vec::with_capacity(n.min(TRUSTED_RESERVE));
            for item in obj.try_iter()? {
                push_id(&mut out, token_id(&item?, what)?, py, what)?;
            }
            Ok(out)
        }
        _ => Err(not_a_sequence(py, what)),
    }
}

fn not_a_sequence(py: Python<'_>, what: &str) -> PyErr {
    invalid(
        py,
        format!("{what} must be a sequence of ints or a 1-D integer array"),
    )
}

fn out_of_range(py: Python<'_>, what: &str, v: impl std::fmt::Display, negative: bool) -> PyErr {
    if negative {
        invalid(py, format!("{what} must be >= 0, got {v}"))
    } else {
        invalid(py, format!("{what} must be < 2**32, got {v}"))
    }
}

/// One element of a list, tuple or other sequence.
fn token_id(item: &Bound<'_, PyAny>, what: &str) -> PyResult<u32> {
    let py = item.py();
    if !is_int(item)? {
        let got = if item.is_instance_of::<PyBool>() {
            "a bool".to_owned()
        } else if item.cast::<PyList>().is_ok() || item.cast::<PyTuple>().is_ok() {
            return Err(invalid(
                py,
                format!("{what} must be 1-D, got a nested {}", type_name(item)),
            ));
        } else {
            type_name(item)
        };
        return Err(invalid(py, format!("{what} must be integers, got {got}")));
    }
    match item.extract::<i64>() {
        Ok(v) => u32::try_from(v).map_err(|_| out_of_range(py, what, v, v < 0)),
        // Beyond 64 bits: only the sign matters for the message.
        Err(_) => Err(out_of_range(py, what, item, item.lt(0)?)),
    }
}

/// A 1-D numpy integer array of any dtype and strides, converted and checked in one pass.
fn array_ids(arr: &Bound<'_, PyUntypedArray>, what: &str) -> PyResult<Vec<u32>> {
    let py = arr.py();
    if arr.ndim() != 1 {
        let shape = arr.getattr("shape")?;
        return Err(invalid(
            py,
            format!("{what} must be 1-D, got shape {shape}"),
        ));
    }
    let dtype = arr.dtype();
    let kind = dtype.kind();
    if kind != b'i' && kind != b'u' {
        return Err(invalid(
            py,
            format!("{what} must be integers, got dtype {dtype}"),
        ));
    }
    if dtype.is_native_byteorder() == Some(false) {
        let native = arr.call_method1("astype", (dtype.call_method1("newbyteorder", ("=",))?,))?;
        return token_ids(&native, what);
    }
    match (kind, dtype.itemsize()) {
        (b'u', 4) => match arr.cast::<PyArray1<u32>>()?.to_vec() {
            Ok(v) => Ok(v), // contiguous: one copy, nothing to check
            Err(_) => convert::<u32>(arr, what),
        },
        (b'i', 4) => convert::<i32>(arr, what),
        (b'i', 8) => convert::<i64>(arr, what),
        (b'u', 8) => convert::<u64>(arr, what),
        (b'i', 2) => convert::<i16>(arr, what),
        (b'u', 2) => convert::<u16>(arr, what),
        (b'i', 1) => convert::<i8>(arr, what),
        (b'u', 1) => convert::<u8>(arr, what),
        _ => Err(invalid(
            py,
            format!("{what} must be integers of at most 64 bits, got dtype {dtype}"),
        )),
    }
}

fn convert<T: Element + Copy + Into<i128>>(
    arr: &Bound<'_, PyUntypedArray>,
    what: &str,
) -> PyResult<Vec<u32>> {
    let py = arr.py();
    let arr = arr.cast::<PyArray1<T>>()?;
    // SAFETY: we read the elements while holding the GIL and no Rust code holds a mutable
    // borrow of a caller's array (this module never writes to one), so the view aliases no
    // `&mut`. This skips rust-numpy's borrow registry, which costs more than the copy.
    let view = unsafe { arr.as_array() };
    check_count(py, what, view.len())?;
    let mut out = Vec::with_capacity(view.len());
    let (mut lo, mut hi) = (0i128, 0i128);
    for &x in view.iter() {
        let v: i128 = x.into();
        lo = lo.min(v);
        hi = hi.max(v);
        out.push(v as u32);
    }
    // Checked after the pass (one branch per element less); the message names the extreme.
    if lo < 0 {
        return Err(out_of_range(py, what, lo, true));
    }
    if hi > u32::MAX as i128 {
        return Err(out_of_range(py, what, hi, false));
    }
    Ok(out)
}
