"""`quickly`: a call that must return within a bound, for tests of inputs that once hung."""

from __future__ import annotations

import threading


def quickly(fn, seconds=5.0):
    """`fn()` on a thread that must finish within `seconds` (a hang fails the test, not
    the suite); returns what it returned or raises what it raised."""
    got: dict = {}

    def run():
        try:
            got["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            got["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still running after {seconds} s"
    if "error" in got:
        raise got["error"]
    return got["value"]
