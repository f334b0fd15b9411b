"""The llama.cpp engine on a tiny random GGUF model written here: greedy lookahead equals
llama.cpp's own greedy decoding token for token, trees are verified in one forward, the KV
cache keeps no stale entry, and bad inputs fail clearly."""

from __future__ import annotations

import types
import warnings

import numpy as np
import pytest
from lookahead import LookaheadCache
from lookahead.errors import InvalidInput, ModelLoadError
from lookahead.sizing import FixedSizer

pytest.importorskip("llama_cpp", reason="needs the llamacpp extra (make llamacpp)")

from lookahead.llamacpp import LlamaCppGenerator, LlamaCppModel, plain_generate  # noqa: E402
from lookahead.llamacpp.generator import sampling_config  # noqa: E402
from lookahead.llamacpp.library import load_params  # noqa: E402
from tiny_gguf import write_tiny_llama  # noqa: E402

VOCAB = 97


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    # A head tied to the embeddings: the model tends to repeat what it has seen, so drafts
    # from the context get accepted and trees of several branches are verified.
    return write_tiny_llama(tmp_path_factory.mktemp("gguf") / "tiny.gguf", vocab=VOCAB,
                            repeat_bias=3.0)  # fmt: skip


# One flash-attention setting for the shared fixtures, so that a failure repeats; the
# default (timed at load) and every setting have tests of their own.
FLASH = "off"


@pytest.fixture(scope="module")
def model(gguf_path):
    m = LlamaCppModel(gguf_path, n_ctx=1024, n_threads=2, flash_attn=FLASH)
    yield m
    m.close()


@pytest.fixture(scope="module")
def plain_model(gguf_path):
    m = LlamaCppModel(gguf_path, n_ctx=1024, n_threads=2, n_seq_max=1, flash_attn=FLASH)
    yield m
    m.close()


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    """Prompts that repeat a phrase, as copy-heavy text does."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        phrase = rng.integers(0, VOCAB, size=int(rng.integers(4, 12))).tolist()
        noise = rng.integers(0, VOCAB, size=int(rng.integers(0, 6))).tolist()
        out.append(noise + phrase * 3 + noise[:2] + phrase[:3])
    return out


def test_greedy_lookahead_equals_llama_cpp_greedy(model, plain_model):
    gen = LlamaCppGenerator(model, sizer=FixedSizer(8, 16))
    accepted = trees = 0
    for ids in prompts(6):
        want = plain_generate(plain_model, ids, 48)
        res = gen.generate(ids, max_new_tokens=48)
        assert res.ids == want, ids
        accepted += sum(res.stats.accepted)
        trees += sum(1 for n in res.stats.draft_nodes if n > 1)
        assert res.stats.steps < len(res.ids)  # drafts saved forwards
    assert accepted > 0 and trees > 0


def test_a_long_generation_keeps_no_stale_cache_entry(model, plain_model):
    # Hundreds of steps of rejected branches: any cell left behind would change later logits.
    ids = prompts(1, seed=3)[0]
    gen = LlamaCppGenerator(model, cache=LookaheadCache(), sizer=FixedSizer(16, 32))
    res = gen.generate(ids, max_new_tokens=400)
    assert res.ids == plain_generate(plain_model, ids, 400)
    rejected = sum(res.stats.draft_nodes) - sum(res.stats.accepted)
    assert rejected >= 100, res.stats  # that many nodes verified, then dropped from the cache


def test_a_quantized_gguf_verifies_trees(tmp_path):
    # Q4_1 matrices of 128 x 256 are what ggml's AMX kernels take: in a build that has them
    # (llama-cpp-python built natively on a Xeon that reports AMX) the first forward of two
    # rows killed the process (SIGSEGV) before `load_params` left them out.
    path = write_tiny_llama(tmp_path / "q4_1.gguf", vocab=VOCAB, hidden=128, ff=256,
                            repeat_bias=3.0, quant="Q4_1")  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the AMX notice, where it applies
        m = LlamaCppModel(path, n_ctx=512, n_threads=2, flash_attn=FLASH)
    try:
        ids = prompts(1, seed=5)[0]
        res = LlamaCppGenerator(m, sizer=FixedSizer(8, 16)).generate(ids, max_new_tokens=40)
        assert len(res.ids) == 40 and all(0 <= t < VOCAB for t in res.ids)
        assert max(res.stats.draft_nodes) > 1  # a forward of several rows ran
        assert res.ids[0] == plain_generate(m, ids, 1)[0]  # a one-row forward agrees
    finally:
        m.close()


class _FakeLlama:
    """`llama_print_system_info` and default model parameters, as llama_cpp gives them."""

    def __init__(self, info: bytes):
        self.info = info

    def llama_print_system_info(self) -> bytes:
        return self.info

    def llama_model_default_params(self):
        return types.SimpleNamespace(use_extra_bufts=True)


def test_a_build_with_amx_kernels_loads_without_them():
    with pytest.warns(RuntimeWarning, match="AMX kernels.*-mno-amx-int8"):
        mp = load_params(_FakeLlama(b"CPU : AVX512 = 1 | AMX_INT8 = 1 | REPACK = 1 | "))
    assert mp.use_extra_bufts is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mp = load_params(_FakeLlama(b"CPU : AVX2 = 1 | AVX512 = 1 | REPACK = 1 | "))
    assert mp.use_extra_bufts is True


def test_logits_read_in_place_are_the_copied_ones(plain_model):
    ids = prompts(1)[0]
    plain_model.reset()
    plain_model.prefill(ids[:-1], [0])
    view = plain_model.decode([ids[-1]], [len(ids) - 1], [[0]], [True], copy=False)
    got = view.copy()
    plain_model.seq_rm(0, len(ids) - 1, -1)
    copied = plain_model.decode([ids[-1]], [len(ids) - 1], [[0]], [True])
    assert copied.flags.owndata  # a copy of its own
    np.testing.assert_array_equal(got, copied)
    assert view.shape == (1, plain_model.n_vocab) and not view.flags.owndata


def test_logits_follow_a_buffer_llama_cpp_moves(plain_model):
    import ctypes

    m = plain_model
    ids = prompts(1)[0]
    m.reset()
    m.prefill(ids[:-1], [0])
    n = len(ids) - 1

    def fresh(i):  # llama.cpp's row i, read through no kept array
        p = m.ll.llama_get_logits_ith(m.ctx, i)
        return np.ctypeslib.as_array(ctypes.cast(p, ctypes.POINTER(ctypes.c_float)),
                                     shape=(m.n_vocab,)).copy()  # fmt: skip

    one = m.decode([ids[-1]], [n], [[0]], [True], copy=False)[0].copy()
    np.testing.assert_array_equal(one, fresh(0))
    before = ctypes.cast(m.ll.llama_get_logits(m.ctx), ctypes.c_void_p).value
    # More rows of logits than llama.cpp reserved: it makes a larger buffer elsewhere.
    wide = 80
    rows = m.decode(list(range(wide)), range(n + 1, n + 1 + wide), [[0]] * wide, [True] * wide)
    assert ctypes.cast(m.ll.llama_get_logits(m.ctx), ctypes.c_void_p).value != before
    np.testing.assert_array_equal(rows[-1], fresh(wide - 1))
    m.seq_rm(0, n, -1)
    again = m.decode([ids[-1]], [n], [[0]], [True], copy=False)
    np.testing.assert_array_equal(again[0], fresh(0))
    np.testing.assert_array_equal(again[0], one)


def test_streaming_gives_every_token_once(model):
    seen = []
    res = LlamaCppGenerator(model).generate(
        prompts(1)[0], 30, on_tokens=lambda t, s: seen.extend(t)
    )
    assert seen == res.ids and len(res.ids) == 30 and res.finish_reason == "length"


def test_host_time_counts_every_step_but_the_callers_own(model):
    import time

    slept = []

    def slow_reader(ids, text):
        t = time.perf_counter()
        time.sleep(0.004)
        slept.append(time.perf_counter() - t)

    st = LlamaCppGenerator(model).generate(prompts(1)[0], 30, on_tokens=slow_reader).stats
    parts = st.draft_s + st.mask_s + st.forward_s + st.verify_s + st.kv_s + st.other_s
    caller = sum(slept)
    # The sizer's learning, stop checks and the last step's extend (the others ride on the
    # draft's call) are counted (other_s > 0);
    # the caller's callback is not, and the parts account for the decode time but the
    # first token's verdict (well under a millisecond on this model).
    assert 0 < st.other_s < caller / 4
    assert 0 <= st.total_s - st.prefill_s - parts - caller < 0.01
    # The drafter's own share (draft, the sizer's learning, extend) lies inside those parts.
    assert 0 < st.drafter_s <= st.draft_s + st.other_s
    assert st.host_overhead == pytest.approx((parts - st.forward_s) / st.forward_s)


def test_bad_files_fail_in_one_line(tmp_path, gguf_path):
    with pytest.raises(ModelLoadError, match="not found"):
        LlamaCppModel(tmp_path / "missing.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model at all")
    with pytest.raises(ModelLoadError, match="not a GGUF"):
        LlamaCppModel(junk)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(gguf_path.read_bytes()[:5000])
    with pytest.raises(ModelLoadError, match="could not load"):
        LlamaCppModel(cut)


def test_bad_requests_fail_before_any_forward(model):
    gen = LlamaCppGenerator(model)
    with pytest.raises(ValueError, match="exceeds the context"):
        gen.generate([1] * 1000, max_new_tokens=100)
    with pytest.raises(ValueError, match="token ids"):
        gen.generate([1, VOCAB + 5], max_new_tokens=4)
    with pytest.raises(ValueError, match="at least one token"):
        gen.generate([], max_new_tokens=4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        gen.generate([1, 2], max_new_tokens=0)
    # and the model still serves
    assert len(gen.generate([1, 2, 3], max_new_tokens=5).ids) == 5


def _sampling_fork_is_a_tie(plain_model, ids, want, j, cfg, seed) -> bool:
    """Whether output position `j`'s uniform lies within rounding of a boundary of plain's
    CDF there: F32 logits of a 9-row forward differ from a one-row forward's by ~1e-3 here,
    which moves the CDF by ~1e-4, so a draw that close to a boundary may flip."""
    import torch
    from lookahead.hf.sampling import warp

    u = torch.rand(256, generator=torch.Generator().manual_seed(seed))[j].item()
    plain_model.reset()
    row = plain_model.prefill(list(ids) + want[:j], [0])
    cdf = warp(torch.from_numpy(row[None]).float(), cfg).softmax(-1)[0].cumsum(0)
    return float((cdf - u).abs().min()) < 1e-3


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sampled_lookahead_equals_plain_sampling_with_the_seed(model, plain_model, seed):
    # One uniform per output position: with a seed, the tokens do not depend on the trees,
    # up to a draw within rounding of a CDF boundary (then the fork must be one).
    cfg = sampling_config(True, temperature=0.7, top_k=20, top_p=0.95)
    gen = LlamaCppGenerator(model, sizer=FixedSizer(8, 16))
    accepted = equal = 0
    for ids in prompts(4, seed=seed):
        want = plain_generate(plain_model, ids, 40, cfg, seed)
        res = gen.generate(
            ids, 40, do_sample=True, temperature=0.7, top_k=20, top_p=0.95, seed=seed
        )
        j = next((i for i, (a, b) in enumerate(zip(res.ids, want)) if a != b), None)
        if j is None:
            assert res.ids == want
            equal += 1
        else:
            assert _sampling_fork_is_a_tie(plain_model, ids, want, j, cfg, seed), (ids, j)
        accepted += sum(res.stats.accepted)
    assert accepted > 0 and equal >= 2
    other = plain_generate(plain_model, prompts(1, seed=seed)[0], 40, cfg, seed + 100)
    assert other != plain_generate(plain_model, prompts(1, seed=seed)[0], 40, cfg, seed)


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    path = write_tiny_llama(tmp_path_factory.mktemp("gguf") / "text.gguf", tokenizer=True,
                            repeat_bias=3.0)  # fmt: skip
    m = LlamaCppModel(path, n_ctx=1024, n_threads=2, flash_attn=FLASH)
    yield m
    m.close()


def test_chat_prompts_follow_the_gguf_template(text_model):
    ids = text_model.encode("Say hi", chat=True)
    shown = text_model.detokenize(ids)
    assert shown.startswith("<|im_start|>") and shown.endswith("assistant\n")
    assert "Say hi<|im_end|>" in shown
    assert text_model.encode([5, 6]) == [5, 6]


def test_stop_strings_end_the_output_and_text_streams_once(text_model):
    gen = LlamaCppGenerator(text_model, sizer=FixedSizer(8))
    prompt = "abc abc abc abc abc"
    full = gen.generate(prompt, 60)
    pieces = [text_model.detokenize([t], special=False) for t in full.ids]
    k = next(i for i in range(4, len(pieces)) if pieces[i].isascii() and pieces[i].strip())
    stop = pieces[k]
    deltas = []
    res = gen.generate(prompt, 60, stop_strings=[stop], on_tokens=lambda t, d: deltas.append(d))
    assert res.finish_reason == "stop_string"
    assert res.text.endswith(stop) and full.text.startswith(res.text)
    assert stop not in res.text[:-len(stop)]  # fmt: skip
    assert "".join(deltas) == res.text
    with pytest.raises(ValueError, match="stop_strings"):
        gen.generate(prompt, 5, stop_strings=[""])


def test_bad_prompts_are_refused_as_the_hf_engine_refuses_them(text_model):
    gen = LlamaCppGenerator(text_model, sizer=FixedSizer(4))
    with pytest.raises(ValueError, match="token ids must be integers"):
        gen.generate([1.7, 2.2], 4)  # would have been truncated to [1, 2]
    with pytest.raises(ValueError, match="the prompt is empty"):
        gen.generate("", 4, chat=True)  # the template alone would have been the prompt
    with pytest.raises(InvalidInput, match="not valid UTF-8"):
        gen.generate("abc\udc80", 4)
    assert len(gen.generate("abc abc", 3).ids) == 3  # and it still serves


def test_threads_default_to_the_cpus_this_process_may_use(gguf_path):
    import os

    from lookahead.llamacpp.model import default_threads

    m = LlamaCppModel(gguf_path, n_ctx=256, n_seq_max=1)
    try:
        assert m.threads == default_threads() == len(os.sched_getaffinity(0))
    finally:
        m.close()


def test_flash_attention_is_measured_unless_asked_and_lookahead_is_exact_either_way(gguf_path):
    ids = prompts(3, seed=5)
    for fa in ("on", "auto", "off"):
        plain = LlamaCppModel(gguf_path, n_ctx=512, n_threads=2, n_seq_max=1, flash_attn=fa)
        tree = LlamaCppModel(gguf_path, n_ctx=512, n_threads=2, flash_attn=fa)
        try:
            assert plain.flash_attn == tree.flash_attn == fa
            assert plain.flash_choice is tree.flash_choice is None  # asked: nothing measured
            gen = LlamaCppGenerator(tree, sizer=FixedSizer(8, 16))
            for p in ids:
                assert gen.generate(p, max_new_tokens=32).ids == plain_generate(plain, p, 32)
        finally:
            plain.close()
            tree.close()
    for bad in ("yes", None, ["off"]):
        with pytest.raises(ValueError, match="flash_attn must be one of fastest, off, on, auto"):
            LlamaCppModel(gguf_path, flash_attn=bad)
    m = LlamaCppModel(gguf_path, n_ctx=256, n_seq_max=1, flash_attn="off")
    try:
        with pytest.raises(ValueError, match="a context's flash_attn is off, on or auto"):
            m.sibling(256, 1, 64, 2, "fastest")  # chosen at load, never a context's own
    finally:
        m.close()


def test_the_default_flash_attention_is_the_setting_measured_faster_at_load(gguf_path):
    from lookahead.llamacpp.flash import OFF_MARGIN, SETTINGS, WIDTHS, pick, workload_s

    m = LlamaCppModel(gguf_path, n_ctx=300, n_threads=2)
    try:
        c = m.flash_choice
        assert c is not None and m.flash_attn == c.choice in SETTINGS
        # the prompt as long as the context allows; every setting and width timed
        assert c.prompt_tokens == 300 - max(WIDTHS) - 1
        assert all(t > 0 for s in SETTINGS for t in (c.prompt_s[s], *c.forward_s[s].values()))
        assert all(tuple(c.forward_s[s]) == WIDTHS for s in SETTINGS)
        assert c.choice == pick({s: workload_s(c.prompt_s[s], c.forward_s[s]) for s in SETTINGS})
        # the probe's contexts are gone: the engine's own has the chosen setting, 33 sequences
        assert m.n_ctx >= 300 and m.n_seq_max == 33 and m.ctx is not None
        gen = LlamaCppGenerator(m, sizer=FixedSizer(8, 16))
        p = prompts(1, seed=7)[0]
        plain = LlamaCppModel(gguf_path, n_ctx=300, n_threads=2, n_seq_max=1, flash_attn=c.choice)
        try:
            assert gen.generate(p, max_new_tokens=24).ids == plain_generate(plain, p, 24)
        finally:
            plain.close()
    finally:
        m.close()
    # on unless off is OFF_MARGIN sooner: the two CPUs' measurements (BENCHMARKS.md section 7)
    assert pick({"off": 1.00, "on": 0.90}) == "on"
    assert pick({"off": 1.00, "on": 1.00}) == "on"
    assert pick({"off": 1.00, "on": 1.00 + OFF_MARGIN / 2}) == "on"
    assert pick({"off": 1.00, "on": 1.00 + 2 * OFF_MARGIN}) == "off"
    assert pick({"off": 1.00, "on": 1.40}) == "off"
    # three forwards in four of one row, one of four rows; one width alone: all of it
    assert workload_s(0.5, {1: 0.01, 4: 0.02}) == pytest.approx(0.5 + 128 * 0.0125)
    assert workload_s(0.5, {1: 0.01}) == pytest.approx(0.5 + 128 * 0.01)


def test_the_start_up_curve_can_time_widths_after_one_row_forwards(gguf_path):
    import lookahead.llamacpp.costs as llama_costs

    model = LlamaCppModel(gguf_path, n_ctx=300, n_threads=2)
    try:
        decodes = []
        real = model.decode
        model.decode = lambda toks, *a, **k: decodes.append(len(toks)) or real(toks, *a, **k)
        for before in (0, 2):
            decodes.clear()
            m = llama_costs.measure_costs(model, widths=(1, 3), context=16, reps=1, before=before)
            assert m.widths == (1, 3) and all(s > 0 for s in m.seconds[0])
            # the context's prefill, then 2 rounds (one warm-up) of each width, each after
            # `before` untimed one-row forwards
            assert decodes == [16] + [x for w in (3, 1, 1, 3) for x in [1] * before + [w]]
    finally:
        model.close()


def test_timings_are_kept_for_later_loads_of_the_same_file(gguf_path, monkeypatch, tmp_path):
    import lookahead.llamacpp.costs as llama_costs
    from lookahead.costs import load_or_measure

    monkeypatch.setenv("LOOKAHEAD_COST_DIR", str(tmp_path))
    measured = []
    real = llama_costs.measure_costs
    monkeypatch.setattr(llama_costs, "measure_costs", lambda m: measured.append(m) or real(m))
    first = LlamaCppModel(gguf_path, n_ctx=300, n_threads=2)
    try:
        gen = LlamaCppGenerator(first)
        assert first.flash_choice.kept is None and len(measured) == 1
        assert gen.cost_model is not None  # read or measured before any request
        assert gen.cost_model.key == llama_costs.cost_key(first)
        gen.generate(prompts(1)[0], 16)
    finally:
        first.close()
    # A later load: the flash choice and the cost curve are read, nothing is timed.
    again = LlamaCppModel(gguf_path, n_ctx=300, n_threads=2)
    try:
        kept = again.flash_choice
        assert kept.kept is not None and kept.choice == first.flash_choice.choice
        assert kept.forward_s == first.flash_choice.forward_s
        assert LlamaCppGenerator(again).cost_model.widths[0] == 1 and len(measured) == 1
        # `calibrate` times both again
        retimed = LlamaCppModel(gguf_path, n_ctx=300, n_threads=2, retime=True)
        assert retimed.flash_choice.kept is None
        retimed.close()
        load_or_measure(again, refresh=True, progress=None)
        assert len(measured) == 2
    finally:
        again.close()
    # Another setting, thread count or file is another key.
    other = LlamaCppModel(gguf_path, n_ctx=300, n_threads=1, flash_attn="on")
    try:
        assert other.flash_choice is None
        LlamaCppGenerator(other)
        assert len(measured) == 3
        assert llama_costs.cost_key(other)["flash_attn"] == "on"
        assert llama_costs.cost_key(other)["threads"] == 1
    finally:
        other.close()
    assert len(list(tmp_path.glob("flash-*.json"))) == 1
    assert len([p for p in tmp_path.glob("*.json") if not p.name.startswith("flash-")]) == 2
