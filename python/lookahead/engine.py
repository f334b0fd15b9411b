"""Moved: the HF engine is the `lookahead.hf` package (one file per stage of a step)."""

raise ImportError(
    "lookahead.engine is now lookahead.hf: import LookaheadGenerator and generate from "
    "lookahead (or lookahead.hf)"
)
