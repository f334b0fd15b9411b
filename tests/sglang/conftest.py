"""CPU tests of the SGLang plugin against the real `sglang==0.5.23` (no CUDA dependencies).

Install: `pip install --no-deps -r requirements/sglang-test.txt`. Without sglang every test
module here is skipped (each starts with `pytest.importorskip("sglang")`), reason shown.

One module is replaced, because it cannot be imported without a GPU:
- `sgl_kernel` (SGLang's compiled CUDA ops; its import loads `libnvrtc`): SGLang's
  `ngram_worker` imports it at module level (through `reconstruct_tree.py`) for NGRAM's
  `reconstruct_indices_from_tree_mask`, which LOOKAHEAD replaces with
  `lookahead.kernels.tree_metadata`. The stand-in's function raises when called, so a test
  fails if our worker ever reached NGRAM's kernel.
"""

from __future__ import annotations

import sys
import types

import pytest

NEEDS_SGLANG = "needs sglang==0.5.23: pip install --no-deps -r requirements/sglang-test.txt"


def _sgl_kernel_unavailable(*args, **kwargs):
    raise RuntimeError("sgl_kernel is replaced in the CPU tests; LOOKAHEAD must not call it")


def _install_sgl_kernel_stand_in() -> None:
    try:
        import sgl_kernel.speculative  # noqa: F401  (a working install wins)

        return
    except Exception:
        pass
    pkg = types.ModuleType("sgl_kernel")
    pkg.__path__ = []
    spec = types.ModuleType("sgl_kernel.speculative")
    spec.reconstruct_indices_from_tree_mask = _sgl_kernel_unavailable
    pkg.speculative = spec
    sys.modules["sgl_kernel"] = pkg
    sys.modules["sgl_kernel.speculative"] = spec


_install_sgl_kernel_stand_in()


@pytest.fixture(scope="session")
def plugins_loaded():
    """SGLang's own plugin loader, run once (as SGLang runs it once per process)."""
    from sglang.srt.plugins import load_plugins

    load_plugins()
    return True
