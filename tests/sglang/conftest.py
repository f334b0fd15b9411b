"""CPU tests of the SGLang plugin against the real `sglang==0.5.23` (no CUDA dependencies).

Install: `make dev` (`pip install --no-deps -r requirements/sglang-test.txt`). Without sglang
every test module here is skipped (each starts with `pytest.importorskip("sglang")`), and
under `CI=true` such a skip fails the run (tests/conftest.py).

`sgl_kernel` (SGLang's compiled ops: CUDA-only on PyPI, its CPU build is for Xeon and not on
PyPI) is replaced by the plain-torch stand-in in `stand_in/` (its docstring says what and
why), appended to `sys.path` here so a working install would still win, and put first on the
`PYTHONPATH` of the CPU servers that `test_server_cpu.py` starts.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

NEEDS_SGLANG = "needs sglang==0.5.23: pip install --no-deps -r requirements/sglang-test.txt"
STAND_IN = Path(__file__).resolve().parent / "stand_in"

if str(STAND_IN) not in sys.path:
    sys.path.append(str(STAND_IN))


@pytest.fixture(scope="session")
def plugins_loaded():
    """SGLang's own plugin loader, run once (as SGLang runs it once per process)."""
    from sglang.srt.plugins import load_plugins

    load_plugins()
    return True


@pytest.fixture(autouse=True)
def _ngram_metadata_kernel_unreachable(monkeypatch):
    """LOOKAHEAD replaces NGRAM's tree-metadata kernel by `lookahead.kernels.tree_metadata`;
    in-process tests fail if our worker ever reaches NGRAM's."""
    try:
        from sglang.srt.speculative import ngram_worker as worker
    except ImportError:
        yield
        return

    def unreachable(*args, **kwargs):
        raise RuntimeError("LOOKAHEAD must not call NGRAM's reconstruct_indices_from_tree_mask")

    monkeypatch.setattr(worker, "reconstruct_indices_from_tree_mask_func", unreachable)
    yield
