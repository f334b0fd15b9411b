"""The plugin loads through SGLang's own loader and registers an NGRAM-shaped algorithm."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import lookahead.sglang as plugin
import pytest

pytest.importorskip("sglang", reason="needs sglang==0.5.23: requirements/sglang-test.txt")


def test_entry_point_is_declared_for_sglang():
    from importlib.metadata import entry_points

    eps = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    assert eps.get("lookahead") == "lookahead.sglang:register"


def test_importing_the_package_does_not_import_sglang():
    import subprocess
    import sys

    code = "import lookahead.sglang, sys; print('sglang' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_from_string_returns_our_class(plugins_loaded):
    from lookahead.sglang.algo import LookaheadSpecAlgo
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    algo = SpeculativeAlgorithm.from_string("LOOKAHEAD")
    assert isinstance(algo, LookaheadSpecAlgo)
    assert SpeculativeAlgorithm.from_string("lookahead") is algo
    assert algo.name == "LOOKAHEAD" and algo.supports_overlap


def _enum_methods():
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    return {
        name: fn
        for name, fn in vars(SpeculativeAlgorithm).items()
        if inspect.isfunction(fn) and not name.startswith("_")
    }


def test_every_method_the_scheduler_calls_exists(plugins_loaded):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    algo = SpeculativeAlgorithm.from_string("LOOKAHEAD")
    missing = sorted(name for name in _enum_methods() if not callable(getattr(algo, name, None)))
    assert missing == []
    # The three 0.5.23's CustomSpecAlgo lacks, which a plain registration crashes on.
    for name in ("carries_draft_hidden_states", "create_future_map", "need_topk"):
        assert name in type(algo).__dict__


def test_predicates_match_ngram(plugins_loaded):
    """Every argument-free predicate answers as NGRAM's does, so each NGRAM branch applies."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    algo = SpeculativeAlgorithm.from_string("LOOKAHEAD")
    ngram = SpeculativeAlgorithm.NGRAM
    compared = []
    for name, fn in _enum_methods().items():
        params = list(inspect.signature(fn).parameters)
        if params == ["self"] and name.startswith(
            ("is_", "supports_", "has_", "need_", "carries_")
        ):
            assert getattr(algo, name)() == getattr(ngram, name)(), name
            compared.append(name)
    assert {"is_ngram", "has_draft_kv", "need_topk", "carries_draft_hidden_states"} <= set(compared)
    assert algo.is_ngram() and not algo.has_draft_kv() and algo.is_speculative()
    assert algo.get_num_tokens_per_req_for_target_verify(12, False) == 12


def test_create_future_map_is_ngram_shaped(plugins_loaded):
    import torch
    from sglang.srt.managers.overlap_utils import FutureMap
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    algo = SpeculativeAlgorithm.from_string("LOOKAHEAD")
    pool = SimpleNamespace(req_to_token=torch.zeros((6, 32), dtype=torch.int32))
    ours = algo.create_future_map(torch.device("cpu"), pool, needs_cpu_seq_lens=False)
    ngram = SpeculativeAlgorithm.NGRAM.create_future_map(
        torch.device("cpu"), pool, needs_cpu_seq_lens=False
    )
    assert type(ours) is FutureMap and ours.spec_algo is algo
    assert ours.req_pool_size == ngram.req_pool_size == 6
    assert ours.needs_cpu_seq_lens is ngram.needs_cpu_seq_lens is False


def test_create_worker_returns_lookahead_worker(plugins_loaded):
    from lookahead.sglang.worker import LookaheadWorker
    from sglang.srt.speculative.ngram_worker import NGRAMWorker
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    algo = SpeculativeAlgorithm.from_string("LOOKAHEAD")
    cls = algo.create_worker(SimpleNamespace(disable_overlap_schedule=False))
    assert cls is LookaheadWorker and issubclass(cls, NGRAMWorker)


def test_register_is_idempotent_and_patches_refuse_twice(plugins_loaded):
    from lookahead.sglang import patches

    plugin.register()  # already ran under load_plugins: a no-op
    assert "lora_compat" in patches.applied_patches()
    assert patches.register_patch("lora_compat") is False
    with pytest.raises(KeyError, match="unknown lookahead patch"):
        patches.register_patch("nope")


def test_lora_patch_treats_lookahead_like_ngram(plugins_loaded):
    from sglang.srt.arg_groups import lora_hook

    assert hasattr(lora_hook.check_lora_speculative_compatibility, "__wrapped__")
    lora_hook.check_lora_speculative_compatibility(
        SimpleNamespace(speculative_algorithm="LOOKAHEAD")
    )
    # Other algorithms still get SGLang's own answer.
    with pytest.raises(ValueError):
        lora_hook.check_lora_speculative_compatibility(
            SimpleNamespace(speculative_algorithm="FROZEN_KV_MTP")
        )


def test_version_check():
    assert plugin.check_sglang_version("0.5.23") == "0.5.23"
    with pytest.raises(plugin.UnsupportedSGLangVersion, match=r"sglang 0\.5\.22 is installed"):
        plugin.check_sglang_version("0.5.22")
    with pytest.raises(
        plugin.UnsupportedSGLangVersion, match="LOOKAHEAD_SGLANG_SKIP_VERSION_CHECK"
    ):
        plugin.check_sglang_version("0.6.0")
    assert plugin.check_sglang_version("0.6.0", skip=True) == "0.6.0"


def test_env_is_read_in_one_place():
    from lookahead.sglang.config import read_env

    env = read_env({"LOOKAHEAD_SGLANG_SKIP_VERSION_CHECK": "1", "LOOKAHEAD_CONFIG": " "})
    assert env.skip_version_check and env.config_json is None
    assert not read_env({}).skip_version_check


def test_register_refuses_an_unsupported_sglang(plugins_loaded, monkeypatch):
    monkeypatch.setattr(plugin, "_registered", False)
    monkeypatch.setattr(plugin.metadata, "version", lambda name: "0.5.21")
    monkeypatch.delenv("LOOKAHEAD_SGLANG_SKIP_VERSION_CHECK", raising=False)
    with pytest.raises(
        plugin.UnsupportedSGLangVersion, match=r"supports sglang 0\.5\.23.*0\.5\.21"
    ):
        plugin.register()
    # The escape hatch: loads anyway (here: finds LOOKAHEAD already registered, keeps it).
    monkeypatch.setenv("LOOKAHEAD_SGLANG_SKIP_VERSION_CHECK", "1")
    plugin.register()
    from lookahead.sglang.algo import LookaheadSpecAlgo
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    assert isinstance(SpeculativeAlgorithm.from_string("LOOKAHEAD"), LookaheadSpecAlgo)
