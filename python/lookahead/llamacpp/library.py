"""llama-cpp-python as this engine uses it: the import (a clear error without the `llamacpp`
extra), the build's AMX kernels and the model parameters that avoid them, llama.cpp's log
silenced, and the one C call read through a prototype of our own (the logits' address)."""

from __future__ import annotations

import ctypes
import warnings

from lookahead.errors import ModelLoadError


def llama_cpp():
    """The llama-cpp-python module, or a clear error if the `llamacpp` extra is missing."""
    try:
        import llama_cpp as ll
    except ImportError as e:
        raise ModelLoadError(
            "the llama.cpp engine needs llama-cpp-python: pip install 'lookahead-spec[llamacpp]' "
            f"(it builds llama.cpp from source with cmake and ninja): {e}"
        ) from e
    return ll


# The compiler flags that build llama.cpp without ggml's AMX kernels (`make llamacpp` passes them).
NO_AMX_FLAGS = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


def amx_kernels(ll) -> bool:
    """Whether this llama.cpp was built with ggml's AMX kernels (`-march=native` on a CPU that
    reports AMX). On this project's Xeon VMs they crash the first forward of two or more rows
    (SIGILL at `tilezero`, SIGSEGV at `ldtilecfg`: the tile config the kernel loads is not the
    one it built, llama.cpp PR #26954), so a model is loaded without them (`load_params`)."""
    return b"AMX_INT8 = 1" in ll.llama_print_system_info()


def load_params(ll):
    """llama.cpp's model parameters for this engine: the defaults, but without the extra
    buffer types when the build has AMX kernels (llama.cpp runs a weight through them only from
    an AMX buffer, an extra buffer type). That also drops ggml's weight repacking, so it warns:
    `make llamacpp` builds without AMX (`NO_AMX_FLAGS`) and keeps repacking."""
    mp = ll.llama_model_default_params()
    if amx_kernels(ll):
        mp.use_extra_bufts = False
        warnings.warn(
            "this llama-cpp-python was built with ggml's AMX kernels, which crash forwards of "
            "two or more rows on some CPUs (llama.cpp PR #26954): loading without them and "
            "without weight repacking. Rebuild it without AMX to repack again: CMAKE_ARGS="
            f"\"-DCMAKE_C_FLAGS='{NO_AMX_FLAGS}' -DCMAKE_CXX_FLAGS='{NO_AMX_FLAGS}'\" pip "
            "install --force-reinstall --no-cache-dir --no-deps --no-build-isolation "
            "llama-cpp-python==0.3.36 (or `make llamacpp`)",
            RuntimeWarning,
            stacklevel=3,
        )
    return mp


_LOG_CB = None  # llama.cpp keeps the pointer: the callback must outlive every call


def logits_address(ll):
    """`llama_get_logits` answering the buffer's address as an int: the same C function
    through a prototype whose result is a `c_void_p`, where llama-cpp-python's answers a float
    pointer that `ctypes.cast` then turns into one (1.2 against 0.2 us in a loop, measured;
    several times that right after a forward)."""
    fn = ctypes.cast(ll.llama_get_logits, ctypes.c_void_p).value
    return ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(fn)


def quiet(ll) -> None:
    """Silences llama.cpp's log on stderr (errors still raise here)."""
    global _LOG_CB
    if _LOG_CB is None:
        _LOG_CB = ll.llama_log_callback(lambda level, text, user: None)
        ll.llama_log_set(_LOG_CB, ctypes.c_void_p(0))
