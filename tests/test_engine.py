"""The HF engine on tiny random models: greedy equality with `model.generate`, edge cases."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from lookahead import LookaheadCache
from lookahead.costs import CostModel
from lookahead.hf import GenerationResult, LookaheadGenerator, generate
from lookahead.hf.kv import KVCacheError
from tiny_models import (
    EOS_ID,
    FAMILIES,
    ScriptedCache,
    hf_generate,
    repetitive_prompt,
    tiny_model,
    tiny_tokenizer,
)

VOCAB = 128


pytestmark = pytest.mark.usefixtures("verify_every_draft", "one_torch_thread")


@pytest.fixture(scope="module", params=FAMILIES)
def family_model(request):
    return request.param, tiny_model(request.param)


def test_greedy_equals_generate_over_random_prompts(family_model):
    family, model = family_model
    gen = LookaheadGenerator(model, budget=12)
    rng = random.Random(1234)
    accepted = 0
    for i in range(16):
        ids = repetitive_prompt(rng, VOCAB)
        new = rng.choice([17, 32])
        ref = hf_generate(model, ids, new)
        res = gen.generate(ids, max_new_tokens=new, eos_token_id=None)
        assert res.ids == ref, f"{family} prompt {i}: {ids}"
        assert res.stats.new_tokens == len(ref)
        accepted += sum(res.stats.accepted)
    # Without accepted drafts the equality above would prove nothing about the tree path.
    assert accepted >= 20, f"{family}: only {accepted} draft tokens accepted"


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_equals_generate_with_scripted_trees(family):
    # Every step accepts a multi-level path that skips wrong siblings, so KV rows move.
    model = tiny_model(family, seed=3)
    rng = random.Random(7)
    for _ in range(3):
        ids = repetitive_prompt(rng, VOCAB)
        ref = hf_generate(model, ids, 30)
        cache = ScriptedCache(ids + ref, VOCAB, chain=5)
        res = LookaheadGenerator(model, cache=cache, budget=10).generate(
            ids, max_new_tokens=30, eos_token_id=None
        )
        assert res.ids == ref
        assert res.stats.steps == 5  # 5 accepted + 1 bonus per step
        assert all(a == 5 for a in res.stats.accepted)
        assert cache.finished
        assert sum(cache.extended, []) == ref


def test_eager_attention_takes_additive_mask():
    model = tiny_model("llama", seed=5, attn_implementation="eager")
    ids = [5, 6, 7, 5, 6, 7, 5, 6]
    ref = hf_generate(model, ids, 24)
    res = LookaheadGenerator(model, cache=ScriptedCache(ids + ref, VOCAB, chain=4)).generate(
        ids, max_new_tokens=24, eos_token_id=None
    )
    assert res.ids == ref
    assert sum(res.stats.accepted) > 0


def test_no_draft_at_all_and_one_token_prompt():
    model = tiny_model("qwen2", seed=2)
    gen = LookaheadGenerator(model, budget=0)
    for ids in ([9], [3, 4, 5, 6, 7, 8, 9, 10]):
        ref = hf_generate(model, ids, 12)
        res = gen.generate(ids, max_new_tokens=12, eos_token_id=None)
        assert res.ids == ref
        assert res.stats.steps == 12
        assert res.stats.accepted == [0] * 12
        assert res.stats.draft_nodes == [0] * 12


def test_drafts_rejected_at_the_root():
    model = tiny_model("gemma", seed=4)
    ids = [11, 12, 13, 11, 12, 13, 11]
    ref = hf_generate(model, ids, 15)
    cache = ScriptedCache(ids + ref, VOCAB, chain=4, correct=False)
    res = LookaheadGenerator(model, cache=cache).generate(ids, max_new_tokens=15, eos_token_id=None)
    assert res.ids == ref
    assert res.stats.accepted == [0] * 15
    assert res.stats.draft_nodes[:11] == [4] * 11  # the script runs out near the end


def _first_new_position(seq: list, lo: int) -> int:
    """An index p >= lo whose token does not occur in seq[:p]."""
    for p in range(lo, len(seq)):
        if seq[p] not in seq[:p]:
            return p
    raise AssertionError(f"no fresh token after {lo} in {seq}")


@pytest.mark.parametrize("as_stop_token", [False, True])
def test_eos_inside_an_accepted_draft(as_stop_token):
    model = tiny_model("llama", seed=6)
    ids = [20, 21, 22, 20, 21, 22, 20]
    ref = hf_generate(model, ids, 30)
    p = _first_new_position(ref, 1)
    stop = ref[p]
    cache = ScriptedCache(ids + ref, VOCAB, chain=8)
    kw = {"stop_token_ids": [stop], "eos_token_id": None} if as_stop_token else {}
    res = LookaheadGenerator(model, cache=cache).generate(
        ids, max_new_tokens=30, **({"eos_token_id": stop} | kw)
    )
    assert res.ids == hf_generate(model, ids, 30, eos_token_id=stop) == ref[: p + 1]
    assert res.finish_reason == ("stop_token" if as_stop_token else "eos")
    # The stop token was a draft accepted in the first step, with drafts accepted past it:
    # those were not output, so not counted (every output token was an accepted draft).
    assert res.stats.steps == 1 and res.stats.draft_nodes[0] > len(res.ids)
    assert res.stats.accepted == [len(res.ids)]


def test_default_eos_comes_from_the_generation_config():
    model = tiny_model("llama", seed=6)
    ids = [20, 21, 22, 20, 21, 22, 20]
    ref = hf_generate(model, ids, 30)
    p = _first_new_position(ref, 2)
    model.generation_config.eos_token_id = ref[p]
    res = LookaheadGenerator(model).generate(ids, max_new_tokens=30)
    assert res.ids == ref[: p + 1]
    assert res.finish_reason == "eos"
    model.generation_config.eos_token_id = EOS_ID


def test_no_eos_when_the_generation_config_has_none():
    # As HF: no fallback to the tokenizer's EOS.
    tok = tiny_tokenizer(VOCAB)
    model = tiny_model("llama", seed=9)
    ids = tok("abcabcabca")["input_ids"]
    ref = hf_generate(model, ids, 20, eos_token_id=None)
    tok.eos_token_id = ref[3]
    model.generation_config.eos_token_id = None
    try:
        res = LookaheadGenerator(model, tok).generate(ids, max_new_tokens=20)
    finally:
        model.generation_config.eos_token_id = EOS_ID
    assert res.ids == ref and res.finish_reason == "length"


def test_generation_config_settings_apply_as_in_hf():
    model = tiny_model("llama", seed=3)
    ids = [20, 21, 22, 20, 21, 22, 20]
    model.generation_config.repetition_penalty = 1.4
    try:
        want = hf_generate(model, ids, 20)  # HF reads the penalty from the config
        kw = dict(max_new_tokens=20, eos_token_id=None)
        res = LookaheadGenerator(model, budget=8).generate(ids, **kw)
        plain = LookaheadGenerator(model).generate(ids, repetition_penalty=1.0, **kw)
    finally:
        model.generation_config.repetition_penalty = 1.0
    assert res.ids == want != plain.ids


def test_draft_tokens_outside_the_vocabulary_are_dropped():
    # A history shared with a bigger vocabulary: its ids must never reach the embedding.
    model = tiny_model("llama", seed=0)
    cache = LookaheadCache(max_depth=8)
    cache.add_history([[5, 6, 7, 8, 500, 501, 502, 503]] * 4)
    res = LookaheadGenerator(model, cache=cache, min_draft_score=0).generate(
        [5, 6, 7, 8], max_new_tokens=8, eos_token_id=None
    )
    assert res.ids == hf_generate(model, [5, 6, 7, 8], 8)


def test_max_new_tokens_caps_the_last_drafts():
    model = tiny_model("qwen2", seed=8)
    ids = [30, 31, 32, 33, 30, 31, 32]
    ref = hf_generate(model, ids, 20)
    for limit in (1, 5, 9):
        cache = ScriptedCache(ids + ref, VOCAB, chain=6)
        res = LookaheadGenerator(model, cache=cache, budget=12).generate(
            ids, max_new_tokens=limit, eos_token_id=None
        )
        assert res.ids == ref[:limit] == hf_generate(model, ids, limit)
        assert res.finish_reason == "length"
        assert res.stats.steps == -(-limit // 7)
        # No draft reaches deeper than the tokens still wanted after its bonus, so no step
        # runs past the limit: every accepted token is output.
        assert sum(res.stats.accepted) + res.stats.steps == limit


def test_stop_strings_and_streaming():
    tok = tiny_tokenizer(VOCAB)
    model = tiny_model("llama", seed=9)
    ids = tok("abcabcabca")["input_ids"]
    ref = hf_generate(model, ids, 30)
    text = tok.decode(ref)
    stop = text[8:11]
    # The reference: the shortest prefix of ref whose text contains the stop string.
    k = next(k for k in range(1, len(ref) + 1) if stop in tok.decode(ref[:k]))
    cache = ScriptedCache(ids + ref, VOCAB, chain=6)
    chunks = []
    res = LookaheadGenerator(model, tok, cache=cache).generate(
        ids,
        max_new_tokens=30,
        eos_token_id=None,
        stop_strings=["never-there", stop],
        on_tokens=lambda new, delta: chunks.append((list(new), delta)),
    )
    assert res.ids == ref[:k]
    assert res.finish_reason == "stop_string"
    assert res.text == tok.decode(ref[:k]) and res.text.endswith(stop)
    assert sum((c[0] for c in chunks), []) == res.ids
    assert "".join(c[1] for c in chunks) == res.text
    assert len(chunks) == res.stats.steps < len(res.ids)


def test_host_time_counts_every_step_but_the_callers_own():
    import time

    model = tiny_model("llama", seed=9)
    slept = []

    def slow_reader(ids, text):
        t = time.perf_counter()
        time.sleep(0.004)
        slept.append(time.perf_counter() - t)

    ids = repetitive_prompt(random.Random(3), VOCAB)
    gen = LookaheadGenerator(model, budget=4)
    st = gen.generate(ids, max_new_tokens=20, eos_token_id=None, on_tokens=slow_reader).stats
    parts = st.draft_s + st.mask_s + st.forward_s + st.verify_s + st.kv_s + st.other_s
    caller = sum(slept)
    # Stop checks, the sizer's learning and the cache's extend count as the step's; the
    # caller's callback does not; the parts account for the decode time but the step's
    # set-up (a KV cache and the tree's buffers).
    assert 0 < st.other_s < caller / 4
    assert 0 <= st.total_s - st.prefill_s - parts - caller < 0.05
    assert st.host_overhead == pytest.approx((parts - st.forward_s) / st.forward_s)
    # The drafter's own share (draft, the sizer's learning, extend) lies inside those parts.
    assert 0 < st.drafter_s <= st.draft_s + st.other_s
    assert st.drafter_us_per_step == pytest.approx(1e6 * st.drafter_s / st.steps)


def test_a_stop_string_before_eos_in_one_step_ends_the_output_first():
    tok = tiny_tokenizer(VOCAB)
    model = tiny_model("llama", seed=9)
    ids = tok("abcabcabca")["input_ids"]
    ref = hf_generate(model, ids, 30)
    p = _first_new_position(ref, 1)
    q = _first_new_position(ref, p + 1)
    stop, eos = tok.decode([ref[p]]), ref[q]
    cache = ScriptedCache(ids + ref, VOCAB, chain=8)  # one step accepts both
    res = LookaheadGenerator(model, tok, cache=cache, budget=16, min_draft_score=0).generate(
        ids, max_new_tokens=30, eos_token_id=eos, stop_strings=[stop]
    )
    assert res.ids == ref[: p + 1] and res.finish_reason == "stop_string"
    assert res.stats.steps == 1


def test_stop_strings_across_the_prompt_as_in_hf():
    # HF's StopStringCriteria reads the prompt too: a stop string may begin there; one that
    # lies in the prompt alone does not stop anything.
    tok = tiny_tokenizer(VOCAB)
    model = tiny_model("llama", seed=9)
    ids = tok("abcabcabca")["input_ids"]
    ref = hf_generate(model, ids, 12)
    gen = LookaheadGenerator(model, tok)
    across, inside = tok.decode(ids[-1:] + ref[:1]), tok.decode(ids[-3:-1])
    for stop in (across, inside):
        with torch.inference_mode():
            want = model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=12,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
                stop_strings=[stop],
                tokenizer=tok,
            )[0, len(ids) :].tolist()
        res = gen.generate(ids, max_new_tokens=12, eos_token_id=None, stop_strings=[stop])
        assert res.ids == want
    assert gen.generate(ids, max_new_tokens=12, stop_strings=[across]).ids == ref[:1]


def test_text_prompt_chat_free_and_result_type():
    tok = tiny_tokenizer(VOCAB)
    model = tiny_model("gemma", seed=10)
    res = generate(model, "hello hello hello", tok, max_new_tokens=8, eos_token_id=None)
    assert isinstance(res, GenerationResult)
    assert res.ids == hf_generate(model, tok("hello hello hello")["input_ids"], 8)
    assert res.text == tok.decode(res.ids)
    d = res.stats.as_dict()
    assert d["new_tokens"] == 8 and d["steps"] == res.stats.steps >= 1
    assert d["forward_s"] > 0 and d["total_s"] >= d["forward_s"]


def test_generators_sharing_a_cache_use_distinct_request_ids():
    import threading

    model = tiny_model("llama")
    cache = LookaheadCache(max_depth=4)
    cache.start_request(0, [1, 2, 3])  # the user's own request, id 0, stays live meanwhile
    gens = [LookaheadGenerator(model, cache=cache) for _ in range(2)]
    want = hf_generate(model, [5, 6, 5, 6], 6)
    got, errors = [], []

    def run(g):
        try:
            for _ in range(3):
                got.append(g.generate([5, 6, 5, 6], max_new_tokens=6, eos_token_id=None).ids)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(g,)) for g in gens]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and got == [want] * 6
    assert cache.stats()["live_requests"] == 1


def test_shared_cache_drafts_from_earlier_outputs():
    model = tiny_model("llama", seed=11)
    gen = LookaheadGenerator(model, cache=LookaheadCache(max_depth=8), budget=12)
    ids = [40, 41, 42, 43, 44, 45]
    first = gen.generate(ids, max_new_tokens=40, eos_token_id=None)
    again = gen.generate(ids, max_new_tokens=40, eos_token_id=None)
    assert first.ids == again.ids == hf_generate(model, ids, 40)
    # The second run drafts from the first run's output kept in the shared history.
    assert sum(again.stats.accepted) > sum(first.stats.accepted)


def test_greedy_with_repetition_penalty_equals_generate():
    model = tiny_model("qwen2", seed=12)
    rng = random.Random(3)
    gen = LookaheadGenerator(model)
    for _ in range(4):
        ids = repetitive_prompt(rng, VOCAB)
        ref = hf_generate(model, ids, 24, repetition_penalty=1.4)
        cache = ScriptedCache(ids + ref, VOCAB, chain=5)
        res = LookaheadGenerator(model, cache=cache).generate(
            ids, max_new_tokens=24, eos_token_id=None, repetition_penalty=1.4
        )
        assert res.ids == ref
        res2 = gen.generate(ids, max_new_tokens=24, eos_token_id=None, repetition_penalty=1.4)
        assert res2.ids == ref


def test_repetition_penalty_with_an_output_head_wider_than_the_vocabulary():
    # Some checkpoints pad the output head past config.vocab_size: one penalty entry per logit.
    model = tiny_model("qwen2", seed=12)
    head = model.get_output_embeddings()
    wide = torch.nn.Linear(head.in_features, VOCAB + 8)
    with torch.no_grad():
        wide.weight.zero_()
        wide.weight[:VOCAB] = head.weight
        wide.bias.zero_()
        wide.bias[VOCAB:] = -1e4  # never the argmax: the padding rows stay unused
    model.set_output_embeddings(wide)
    ids = [20, 21, 22, 20, 21, 22, 20]
    ref = hf_generate(model, ids, 16, repetition_penalty=1.4)
    res = LookaheadGenerator(model).generate(
        ids, max_new_tokens=16, eos_token_id=None, repetition_penalty=1.4
    )
    assert res.ids == ref


def test_a_forward_without_logits_to_keep():
    # Remote-code models may not take HF's `logits_to_keep`: the prefill asks without it.
    model = tiny_model("llama", seed=4)

    class Plain(type(model)):
        def forward(
            self,
            input_ids=None,
            attention_mask=None,
            position_ids=None,
            past_key_values=None,
            use_cache=None,
        ):
            return super().forward(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=past_key_values,
                use_cache=use_cache,
            )

    ids = [20, 21, 22, 20, 21, 22, 20]
    want = hf_generate(model, ids, 12)
    model.__class__ = Plain
    res = LookaheadGenerator(model).generate(ids, max_new_tokens=12, eos_token_id=None)
    assert res.ids == want


class _NoCacheLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.config = tiny_model("llama").config
        self.lin = torch.nn.Linear(2, 2)

    def forward(self, input_ids):
        return input_ids


def test_bad_input_gives_clear_errors():
    model = tiny_model("llama")
    gen = LookaheadGenerator(model)
    with pytest.raises(ValueError, match="empty"):
        gen.generate([], max_new_tokens=4)
    with pytest.raises(ValueError, match="empty"):
        LookaheadGenerator(model, tiny_tokenizer(VOCAB)).generate("", max_new_tokens=4)
    with pytest.raises(ValueError, match="tokenizer"):
        gen.generate("text without a tokenizer", max_new_tokens=4)
    for bad in (0, -3):
        with pytest.raises(ValueError, match="max_new_tokens"):
            gen.generate([5, 6], max_new_tokens=bad)
    with pytest.raises(ValueError, match="temperature"):
        gen.generate([5, 6], max_new_tokens=4, do_sample=True, temperature=0.0)
    with pytest.raises(ValueError, match="budget"):
        LookaheadGenerator(model, budget=-1)
    with pytest.raises(ValueError, match="batch"):
        gen.generate(torch.ones((2, 3), dtype=torch.long), max_new_tokens=4)
    with pytest.raises(KVCacheError, match="past_key_values"):
        LookaheadGenerator(_NoCacheLM())
    with pytest.raises(KVCacheError, match="not an HF"):
        LookaheadGenerator(object())
    for bad in (1.5, "8", True, 10**6):
        with pytest.raises(ValueError, match="budget must be an int"):
            LookaheadGenerator(model, budget=bad)
        with pytest.raises(ValueError, match="budget must be an int"):
            gen.generate([5, 6], max_new_tokens=4, budget=bad)
    with pytest.raises(ValueError, match="max_budget"):
        LookaheadGenerator(model, budget=8, max_budget=10**6)
    with pytest.raises(ValueError, match="multi_branch must be a bool"):
        LookaheadGenerator(model, multi_branch="no")
    with pytest.raises(ValueError, match="multi_branch must be a bool"):
        gen.generate([5, 6], max_new_tokens=4, multi_branch="yes")
    with pytest.raises(ValueError, match="min_draft_score"):
        LookaheadGenerator(model, min_draft_score="x")
    # Token-id prompts are checked, not converted: floats, nested lists, ids out of the
    # model's vocabulary.
    with pytest.raises(ValueError, match="integers"):
        gen.generate([5.7, 6.2], max_new_tokens=4)
    with pytest.raises(ValueError, match="integers"):
        gen.generate(torch.tensor([5.0, 6.0]), max_new_tokens=4)
    with pytest.raises(ValueError, match=r"\[0, 128\)"):
        gen.generate([5, VOCAB], max_new_tokens=4)
    with pytest.raises(ValueError, match=r"\[0, 128\)"):
        gen.generate([-1, 5], max_new_tokens=4)
    with pytest.raises(ValueError, match="1-D"):
        gen.generate([[[5, 6]]], max_new_tokens=4)
    with pytest.raises(ValueError, match="1-D"):
        gen.generate(torch.tensor(5), max_new_tokens=4)
    with pytest.raises(ValueError, match="integers"):
        gen.generate(torch.tensor([5, 6], dtype=torch.bfloat16), max_new_tokens=4)
    with pytest.raises(ValueError, match="min_draft_score must be a finite"):
        LookaheadGenerator(model, min_draft_score=float("inf"))
    for kw, match in (
        ({"max_new_tokens": True}, "max_new_tokens"),
        ({"do_sample": "no"}, "do_sample must be a bool"),
        ({"do_sample": True, "top_k": 2.5}, "top_k must be an int"),
        ({"do_sample": True, "top_k": True}, "top_k must be an int"),
        ({"do_sample": True, "temperature": "0.5"}, "temperature must be a number"),
        ({"do_sample": True, "temperature": float("inf")}, "temperature must be a finite"),
        ({"seed": 1.5}, "seed"),
        ({"seed": 2**70}, "seed"),
        ({"seed": -1}, "seed"),
        ({"eos_token_id": -1}, "eos_token_id"),
        ({"eos_token_id": "x"}, "eos_token_id"),
        ({"stop_token_ids": [True]}, "stop_token_ids"),
        ({"on_tokens": 5}, "on_tokens must be callable"),
        ({"stop_strings": [1]}, "stop_strings must be"),
        ({"stop_strings": ["a", ""]}, "empty string"),
    ):
        with pytest.raises(ValueError, match=match):
            gen.generate([5, 6], **({"max_new_tokens": 4} | kw))
    # HF's defaults for these are None.
    assert len(gen.generate([5, 6], max_new_tokens=2, stop_strings=None).ids) == 2
    # Any iterable of ints is a prompt: the same output from each form.
    want = gen.generate([5, 6, 5, 6], max_new_tokens=3, eos_token_id=None).ids
    for form in (
        (x for x in [5, 6, 5, 6]),
        map(int, "5656"),
        np.array([5, 6, 5, 6], dtype=object),
        np.array([[5, 6, 5, 6]], dtype=np.uint32),
        (5, 6, 5, 6),
    ):
        assert gen.generate(form, max_new_tokens=3, eos_token_id=None).ids == want
    # The generator stays usable after errors (no request left open in the trie).
    assert gen.generate([5, 6, 5, 6], max_new_tokens=3, eos_token_id=None).ids == hf_generate(
        model, [5, 6, 5, 6], 3
    )


def test_low_score_drafts_are_dropped_and_output_unchanged():
    family, model = "llama", tiny_model("llama")
    rng = random.Random(99)
    ids = repetitive_prompt(rng, VOCAB)
    ref = hf_generate(model, ids, 24)
    # No draft can reach this score: every step verifies the root alone.
    res = LookaheadGenerator(model, budget=8, min_draft_score=1e9).generate(
        ids, max_new_tokens=24, eos_token_id=None
    )
    assert res.ids == ref, family
    assert res.stats.skipped_drafts > 0
    assert sum(res.stats.accepted) == 0 and res.stats.steps == 24
    with pytest.raises(ValueError, match="min_draft_score"):
        LookaheadGenerator(model, min_draft_score=-1.0)
    with pytest.raises(ValueError, match="min_draft_score"):
        LookaheadGenerator(model, min_draft_score=float("nan"))


def test_defaults_size_drafts_by_cost_and_overrides_fix_them():
    from lookahead.sizing import AUTO_MAX_NODES, FIXED_BUDGET, CostAwareSizer, FixedSizer

    model = tiny_model("llama")
    gen = LookaheadGenerator(model)
    s = gen.sizer
    assert isinstance(s, CostAwareSizer) and s.max_nodes == AUTO_MAX_NODES
    assert s.min_score == 0.0
    # Any of the three knobs: the fixed policy, the others at their fixed defaults.
    g = LookaheadGenerator(model, min_draft_score=0.2)
    assert isinstance(g.sizer, FixedSizer) and g.cost_model is None
    assert (g.sizer.base, g.sizer.max_nodes, g.sizer.min_score) == (FIXED_BUDGET, FIXED_BUDGET, 0.2)
    g = LookaheadGenerator(model, budget=3)
    assert isinstance(g.sizer, FixedSizer) and (g.sizer.base, g.sizer.max_nodes) == (3, 3)
    assert LookaheadGenerator(model, cost_model=None).sizer.base == FIXED_BUDGET
    # With a cost model too, the budget caps what the choice may take.
    flat = CostModel.from_rows({1: 1.0, 64: 1.0})
    g = LookaheadGenerator(model, budget=5, cost_model=flat)
    assert isinstance(g.sizer, CostAwareSizer) and g.cost_model is flat
    assert g.sizer.max_nodes == 5
    with pytest.raises(ValueError, match="cost_model"):
        LookaheadGenerator(model, cost_model="fast")
    # A sizer object, alone: with a shorthand beside it the call is refused.
    mine = FixedSizer(4, 6, 0.5)
    assert LookaheadGenerator(model, sizer=mine).sizer is mine
    with pytest.raises(ValueError, match="not both"):
        LookaheadGenerator(model, sizer=mine, budget=4)
    with pytest.raises(ValueError, match="not both"):
        LookaheadGenerator(model, sizer=mine, cost_model=None)
    with pytest.raises(ValueError, match="Sizer"):
        LookaheadGenerator(model, sizer=object())


class _BudgetSpy:
    """A cache that records the budget of every draft."""

    def __init__(self, inner):
        self.inner, self.budgets = inner, []

    def draft(self, rid, budget, multi_branch=True, **bounds):
        self.budgets.append(budget)
        return self.inner.draft(rid, budget=budget, multi_branch=multi_branch, **bounds)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_budget_grows_after_a_deep_acceptance():
    from lookahead.hf import DEEP_ACCEPT

    model = tiny_model("llama")
    assert LookaheadGenerator(model, budget=3).sizer.max_nodes == 3  # an explicit budget is fixed
    assert LookaheadGenerator(model, budget=3, max_budget=12).sizer.max_nodes == 12
    assert LookaheadGenerator(model, max_budget=2).sizer.max_nodes == 8  # never below the budget
    with pytest.raises(ValueError, match="max_budget"):
        LookaheadGenerator(model, max_budget=-1)
    ids = repetitive_prompt(random.Random(5), VOCAB)
    ref = hf_generate(model, ids, 48)
    spy = _BudgetSpy(LookaheadCache())
    gen = LookaheadGenerator(model, cache=spy, budget=8, max_budget=16)
    # The second run drafts its own earlier output from the shared history: deep acceptances.
    assert gen.generate(ids, max_new_tokens=48, eos_token_id=None).ids == ref
    spy.budgets.clear()
    res = gen.generate(ids, max_new_tokens=48, eos_token_id=None)
    assert res.ids == ref
    assert len(spy.budgets) == res.stats.steps and spy.budgets[0] == 8
    prev = res.stats.accepted[:-1]
    assert spy.budgets[1:] == [16 if a >= DEEP_ACCEPT else 8 for a in prev]
    assert 16 in spy.budgets
    # A budget given to `generate` is a fixed width for that call.
    spy.budgets.clear()
    assert gen.generate(ids, max_new_tokens=48, eos_token_id=None, budget=6).ids == ref
    assert set(spy.budgets) == {6}
    # The one-shot `generate` takes both as generator options.
    spy.budgets.clear()
    kw = dict(cache=spy, budget=4, max_budget=12, min_draft_score=0.0, eos_token_id=None)
    assert generate(model, ids, max_new_tokens=48, **kw).ids == ref
    assert set(spy.budgets) == {4, 12}
    with pytest.raises(ValueError, match="max_budget"):
        LookaheadGenerator(model, max_budget=1 << 17)


def test_text_leaves_out_special_tokens_but_stop_strings_see_them():
    from lookahead.hf.stopping import TextTracker as _TextTracker

    tok = tiny_tokenizer(VOCAB)
    ids = [tok.convert_tokens_to_ids(c) for c in "ok"] + [EOS_ID]
    shown = _TextTracker(tok, [])
    assert shown.text(ids) == "ok" and shown.delta(ids, final=True) == "ok"
    kept = _TextTracker(tok, [], skip_special_tokens=False)
    assert kept.text(ids) == "ok</s>" and kept.delta(ids, final=True) == "ok</s>"
    # As in HF, a stop string is matched on the text with special tokens.
    assert _TextTracker(tok, ["k</s>"]).stop_cut(ids, 0) == 3
    with pytest.raises(ValueError, match="skip_special_tokens must be a bool"):
        generate(tiny_model("llama"), [3, 4], tok, skip_special_tokens="no")


def test_generate_text_drops_a_special_eos_unless_asked():
    tok = tiny_tokenizer(VOCAB)
    model = tiny_model("llama", seed=6)
    ids = [20, 21, 22, 20, 21, 22, 20]
    ref = hf_generate(model, ids, 12)
    p = _first_new_position(ref, 2)
    eos = ref[p]
    # The model's p-th token becomes a special token (as a chat template's end marker is).
    tok.add_special_tokens({"additional_special_tokens": [tok.convert_ids_to_tokens(eos)]})
    assert tok.convert_tokens_to_ids(tok.convert_ids_to_tokens(eos)) == eos
    for skip in (True, False):
        chunks = []
        res = generate(
            model,
            ids,
            tok,
            max_new_tokens=12,
            eos_token_id=eos,
            skip_special_tokens=skip,
            on_tokens=lambda new, delta, chunks=chunks: chunks.append(delta),
        )
        assert res.ids == ref[: p + 1] and res.finish_reason == "eos"
        assert res.text == tok.decode(res.ids, skip_special_tokens=skip) == "".join(chunks)
        assert res.text.endswith(tok.convert_ids_to_tokens(eos)) is not skip
