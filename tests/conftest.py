"""Fixtures shared by the engine tests (opted into with `pytestmark`, never autouse here),
and the CI rule that a skip without an allowance fails the run."""

import os

import pytest
import torch


def pytest_configure(config):
    """Cost curves measured for tiny test models go to a folder of this run, not the user's
    cache (`$LOOKAHEAD_COST_DIR`, unless the caller set it)."""
    import tempfile

    if "LOOKAHEAD_COST_DIR" not in os.environ:
        os.environ["LOOKAHEAD_COST_DIR"] = tempfile.mkdtemp(prefix="lookahead-costs-")


@pytest.fixture
def verify_every_draft(monkeypatch):
    """Default generators verify every node drafted (up to `AUTO_MAX_NODES`), whatever this
    machine's measured costs and however the drafts score (scripted ones score 0)."""
    import lookahead.costs
    import lookahead.sizing
    from lookahead.costs import CostModel

    flat = CostModel.from_rows({1: 1.0, 64: 1.0})
    monkeypatch.setattr(lookahead.costs, "load_or_measure", lambda model: flat)
    monkeypatch.setattr(lookahead.sizing, "choose_nodes", lambda e, costs, host_s=0.0: len(e))


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models: thread start-up costs more than it saves, and CI shares 2 cores."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


# -- CI: no silent skips, and counts per folder ------------------------------------------
# Under CI=true a skipped test fails the run unless its reason starts with one of these
# allowances, each a condition that holds on every CI machine of this project (no GPU).
CI_ALLOWED_SKIP_REASONS = ("needs a CUDA GPU",)

_skips: list[tuple[str, str]] = []
_outcomes: dict[str, str] = {}  # nodeid -> passed / failed / skipped / xfailed (a module too)


def _folder(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    parts = path.split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else parts[0]


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def pytest_collectreport(report):
    if report.skipped:  # a whole module skipped at import (importorskip)
        _skips.append((report.nodeid, _skip_reason(report)))
        _outcomes[report.nodeid] = "skipped"
    elif report.failed:  # a module that failed to import
        _outcomes[report.nodeid] = "failed"


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail"):
        _skips.append((report.nodeid, _skip_reason(report)))
    if report.failed:  # in setup, call or teardown: the test failed
        _outcomes[report.nodeid] = "failed"
    elif report.when == "call" or (report.when == "setup" and report.skipped):
        outcome = "xfailed" if hasattr(report, "wasxfail") else report.outcome
        _outcomes.setdefault(report.nodeid, outcome)


def _under_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def _disallowed_skips() -> list[tuple[str, str]]:
    return [(n, r) for n, r in _skips if not r.startswith(CI_ALLOWED_SKIP_REASONS)]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    tr = terminalreporter
    counts: dict[str, dict[str, int]] = {}
    for nodeid, outcome in _outcomes.items():
        c = counts.setdefault(_folder(nodeid), {"passed": 0, "failed": 0, "skipped": 0})
        c[outcome] = c.get(outcome, 0) + 1
    tr.section("results per folder")
    for folder in sorted(counts):
        c = counts[folder]
        xfailed = f"  xfailed {c['xfailed']:>3}" if c.get("xfailed") else ""
        tr.write_line(
            f"{folder:<28} collected {sum(c.values()):>4}  passed {c['passed']:>4}  "
            f"failed {c['failed']:>3}  skipped {c['skipped']:>3}{xfailed}"
        )
    if _under_ci() and _disallowed_skips():
        tr.section("skips not allowed under CI")
        for nodeid, reason in _disallowed_skips():
            tr.write_line(f"{nodeid}: {reason}")
        tr.write_line(
            "CI=true: every skip needs an allowance in tests/conftest.py "
            f"CI_ALLOWED_SKIP_REASONS {CI_ALLOWED_SKIP_REASONS}; install what the test needs"
        )


def pytest_sessionfinish(session, exitstatus):
    if _under_ci() and exitstatus == 0 and _disallowed_skips():
        session.exitstatus = 1


@pytest.fixture
def fifo(tmp_path):
    """A FIFO no one writes to or reads from (opened blocking, it would hang forever)."""
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path
