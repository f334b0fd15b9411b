"""Fixtures shared by the engine tests (opted into with `pytestmark`, never autouse here)."""

import pytest
import torch


@pytest.fixture
def verify_every_draft(monkeypatch):
    """Turn off the CPU cost gate (`min_draft_score`) so every draft takes the tree path."""
    import lookahead.engine

    monkeypatch.setattr(lookahead.engine, "DEFAULT_MIN_DRAFT_SCORE", {})


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models: thread start-up costs more than it saves, and CI shares 2 cores."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
