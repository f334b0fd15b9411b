"""Lazy Triton: `import lookahead.kernels` must work where triton is absent or unwanted.

Kernels are written as plain functions decorated with `lazy_jit`; the decorator keeps the
function and only imports triton (binding the module-level name `tl` of the kernel's file to
`triton.language`) and applies `triton.jit` on the first launch. Triton reads the kernel's
source and globals at compile time, so the late binding is invisible to it. Annotations must
be strings (`from __future__ import annotations`), which triton accepts for `tl.constexpr`.
"""

from __future__ import annotations

import os
from typing import Any, Callable


def interpret_mode() -> bool:
    """True when Triton runs kernels in its CPU interpreter (tests)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


class lazy_jit:  # noqa: N801 - used as a decorator, like triton.jit
    """`triton.jit`, applied on first launch (`kernel[grid](...)`)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__
        self._jitted: Any = None

    def jitted(self) -> Any:
        """The `triton.jit` function (imports triton on first use)."""
        if self._jitted is None:
            import triton
            import triton.language as tl

            self.fn.__globals__["tl"] = tl
            self._jitted = triton.jit(self.fn)
        return self._jitted

    def __getitem__(self, grid: Any) -> Any:
        launch = self.jitted()[grid]

        def run(*args: Any, **kwargs: Any) -> Any:
            # Triton launches on the current CUDA device: make it the inputs' (tensors on
            # cuda:1 while cuda:0 is current would be read through the wrong context).
            dev = next((a.device for a in args if getattr(a, "is_cuda", False)), None)
            if dev is None:
                return launch(*args, **kwargs)
            import torch

            with torch.cuda.device(dev):
                return launch(*args, **kwargs)

        return run


def next_pow2(n: int) -> int:
    """Smallest power of two >= max(n, 1) (Triton block sizes must be powers of two)."""
    return 1 << max(int(n) - 1, 0).bit_length()


def check_launchable(*tensors: Any) -> None:
    """Triton launchers take CUDA tensors, or CPU tensors under TRITON_INTERPRET=1."""
    if interpret_mode():
        return
    for t in tensors:
        if not t.is_cuda:
            raise ValueError(
                f"the Triton launcher got a {t.device} tensor; it needs CUDA tensors "
                "(or TRITON_INTERPRET=1 for the CPU interpreter). Use the dispatch "
                "function, which routes CPU tensors to the torch reference."
            )
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        raise ValueError(
            f"the Triton launcher's inputs lie on several devices: {sorted(map(str, devices))}"
        )
