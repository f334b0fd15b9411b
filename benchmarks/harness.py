"""Shared bench helpers: percentiles, argument types, the `__main__` of a script."""

from __future__ import annotations

import argparse
import ast
import sys

import numpy as np


def percentile(values, q: float) -> float:
    """The q-th percentile (0..100) of `values`, NaN when empty."""
    a = np.asarray(values, dtype=np.float64)
    return float(np.percentile(a, q)) if a.size else float("nan")


def parse_kwargs(spec: str) -> dict:
    """Keyword arguments written as Python literals: `'a=1,b=(3,6)'` -> `{"a": 1, "b": (3, 6)}`
    (the variants of the benchmarks/ scripts)."""
    try:
        call = ast.parse(f"f({spec})", mode="eval").body
        if call.args or any(kw.arg is None for kw in call.keywords):
            raise ValueError("every item must be NAME=VALUE")
        return {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
    except (SyntaxError, ValueError) as e:
        raise ValueError(
            f"bad variant {spec!r}: {e} (write NAME=VALUE,... as Python literals)"
        ) from None


def positive_int(text: str) -> int:
    """argparse type: an int >= 1."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def positive_ints(text: str) -> list[int]:
    """argparse type: comma-separated ints >= 1 (at least one)."""
    parts = [x for x in text.split(",") if x.strip()]
    if not parts:
        raise argparse.ArgumentTypeError("needs at least one integer")
    return [positive_int(x) for x in parts]


def run_script(main, doc: str | None) -> None:
    """The `__main__` of a `benchmarks/` script: `-h` / `--help` prints its docstring (and
    runs nothing); else `main(sys.argv[1:])` gives the exit status."""
    argv = sys.argv[1:]
    if {"-h", "--help"} & set(argv):
        print((doc or "").strip())
        sys.exit(0)
    sys.exit(main(argv) or 0)
