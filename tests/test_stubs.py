"""`python/lookahead/_core.pyi` describes the compiled module exactly (mypy's stubtest)."""

from __future__ import annotations

import subprocess
import sys


def test_core_stub_matches_the_compiled_module():
    run = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "lookahead._core"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
