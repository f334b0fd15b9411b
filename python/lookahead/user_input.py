"""What comes from outside (files users name, JSON they write), read within stated bounds.

Every reader of outside data goes through here, so that none of them can hang, abort or
grow without bound on hostile input:

- `read_file` opens without blocking (a FIFO with no writer does not hang the run), refuses
  anything that is not a regular file after opening it (a FIFO, `/dev/zero`, a directory,
  a symlink to any of them), and reads at most `limit` bytes, refusing a longer file
  before parsing it.
- `loads_json` refuses what Python's `json` would accept but no config or data file of
  ours holds: NaN and Infinity, numbers that overflow to infinity, integers of more than
  `MAX_INT_DIGITS` digits (Python's own limit is 4,300 digits, with a bare ValueError),
  nesting deeper than `MAX_JSON_DEPTH` (deep enough input raises RecursionError), and a
  key given twice in one object (`json` keeps the last silently).
- Errors are one type, `lookahead.UserInputError` (a ValueError), and quote at most `QUOTE_CHARS`
  characters of a bad value (`quote`), so a 10 MB value never becomes a 10 MB message.
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Any

from lookahead.errors import UserInputError

__all__ = [
    "MAX_INT_DIGITS",
    "MAX_JSON_DEPTH",
    "QUOTE_CHARS",
    "UserInputError",
    "decode",
    "loads_json",
    "quote",
    "read_file",
]

# Deepest nesting of arrays and objects accepted (our files nest 3 deep at most).
MAX_JSON_DEPTH = 32
# Longest integer accepted, in digits (a uint64 has 20).
MAX_INT_DIGITS = 20
# Longest quote of a bad value in an error message.
QUOTE_CHARS = 80
_CHUNK = 1 << 20


def quote(value: Any) -> str:
    """`repr(value)`, cut to `QUOTE_CHARS` characters with its full length said."""
    text = repr(value) if not isinstance(value, str) or len(value) <= QUOTE_CHARS else None
    if text is not None and len(text) <= QUOTE_CHARS:
        return text
    if isinstance(value, str):
        return f"{value[:QUOTE_CHARS]!r}... ({len(value)} characters)"
    return f"{text[:QUOTE_CHARS]}... ({len(text)} characters)"


def read_file(path: str | os.PathLike, limit: int, what: str) -> bytes:
    """The bytes of the regular file `path`, at most `limit` of them. FileNotFoundError
    when it is missing (callers often treat that apart); UserInputError when it is not a
    regular file, is longer than `limit` bytes, or cannot be read. `what` names the file
    in messages ("cost file", "prompt file")."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise UserInputError(f"{what} {path}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UserInputError(f"{what} {path} is not a regular file")
        if st.st_size > limit:
            raise UserInputError(f"{what} {path} has {st.st_size} bytes; at most {limit} are read")
        chunks, n = [], 0
        while True:  # the size can change while reading: the limit holds whatever it says
            try:
                got = os.read(fd, min(_CHUNK, limit + 1 - n))
            except OSError as e:
                raise UserInputError(f"{what} {path}: {e.strerror or e}") from None
            if not got:
                break
            chunks.append(got)
            n += len(got)
            if n > limit:
                raise UserInputError(f"{what} {path} has over {limit} bytes; at most that is read")
        return b"".join(chunks)
    finally:
        os.close(fd)


def decode(raw: bytes, what: str) -> str:
    """`raw` as UTF-8 text; UserInputError naming `what` otherwise."""
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserInputError(f"{what} is not UTF-8 text: {e}") from None


def _depth(value: Any) -> int:
    """The nesting depth of a parsed JSON value (0 for a scalar), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            v = v.values()
        elif not isinstance(v, list):
            continue
        deepest = max(deepest, d + 1)
        if deepest > MAX_JSON_DEPTH:
            return deepest
        stack.extend((x, d + 1) for x in v if isinstance(x, (dict, list)))
    return deepest


def loads_json(text: str | bytes, what: str) -> Any:
    """`json.loads(text)` within the bounds of this module; UserInputError naming `what`
    (a path, or a variable's name) otherwise."""
    if isinstance(text, (bytes, bytearray)):
        text = decode(text, what)

    def pairs(items: list) -> dict:
        out: dict = {}
        for k, v in items:
            if k in out:
                raise UserInputError(f"{what}: key {quote(k)} appears twice in one object")
            out[k] = v
        return out

    def constant(name: str) -> Any:
        raise UserInputError(f"{what}: {name} is not a number (only finite numbers are read)")

    def integer(digits: str) -> int:
        if len(digits.lstrip("-")) > MAX_INT_DIGITS:
            raise UserInputError(
                f"{what}: an integer of {len(digits)} digits (at most {MAX_INT_DIGITS} are read)"
            )
        return int(digits)

    def real(digits: str) -> float:
        v = float(digits)
        if not math.isfinite(v):
            raise UserInputError(f"{what}: {quote(digits)} overflows a float")
        return v

    try:
        value = json.loads(
            text,
            object_pairs_hook=pairs,
            parse_constant=constant,
            parse_int=integer,
            parse_float=real,
        )
    except RecursionError:
        raise UserInputError(f"{what}: nested deeper than {MAX_JSON_DEPTH} levels") from None
    except json.JSONDecodeError as e:
        raise UserInputError(f"{what} is not valid JSON: {e}") from None
    if _depth(value) > MAX_JSON_DEPTH:
        raise UserInputError(f"{what}: nested deeper than {MAX_JSON_DEPTH} levels")
    return value


def read_json_file(path: str | os.PathLike, limit: int, what: str) -> Any:
    """`loads_json` of `read_file(path, limit, what)`, naming the path."""
    return loads_json(read_file(path, limit, what), f"{what} {Path(path)}")
