"""The real default model (SmolLM2-135M-Instruct): fp32 lookahead equals `model.generate`."""

from __future__ import annotations

import pytest
from lookahead import models
from lookahead.demo import chat_ids, plain_generate
from lookahead.hf import LookaheadGenerator


@pytest.fixture(scope="module")
def fp32_model():
    try:
        return models.load_model(None, "float32")
    except models.ModelLoadError as e:
        pytest.skip(f"the default model could not be fetched from PyPI: {e}")


@pytest.mark.slow
def test_fp32_greedy_equals_generate_on_the_default_model(fp32_model):
    model, tok = fp32_model
    prompt = (
        "Repeat this list exactly, then say done: apple, banana, cherry, apple, banana, "
        "cherry, apple, banana, cherry."
    )
    ids = chat_ids(tok, prompt)
    ref, _ = plain_generate(model, ids, 40)
    res = LookaheadGenerator(model, tok).generate(ids, max_new_tokens=40)
    assert res.ids == ref, (tok.decode(ref), res.text)
    assert sum(res.stats.accepted) > 0
    assert res.text == tok.decode(res.ids, skip_special_tokens=True)
