"""SGLang's own CLI parser and speculative-argument resolution with `LOOKAHEAD`."""

from __future__ import annotations

import pytest

pytest.importorskip("sglang", reason="needs sglang==0.5.23: requirements/sglang-test.txt")

BASE = [
    "--model-path",
    "/nonexistent/model",
    "--page-size",
    "1",
    "--attention-backend",
    "flashinfer",
]


def resolve(argv, monkeypatch, config_json=None):
    """SGLang's parser (`prepare_server_args`), then SGLang's speculative resolution step
    (`handle_speculative_decoding`, the pipeline step that runs our `handle_server_args`).
    The rest of the pipeline needs a model checkpoint and a GPU."""
    from sglang.srt.arg_groups.overrides import resolution_result
    from sglang.srt.arg_groups.speculative_hook import handle_speculative_decoding
    from sglang.srt.server_args import prepare_server_args

    if config_json is None:
        monkeypatch.delenv("LOOKAHEAD_CONFIG", raising=False)
    else:
        monkeypatch.setenv("LOOKAHEAD_CONFIG", config_json)
    args = prepare_server_args(BASE + argv)
    args._resolved_overrides = []
    handle_speculative_decoding(args)
    return args, lambda field: resolution_result(args, field)


def serving_config(get):
    from types import SimpleNamespace

    from lookahead.sglang.config import ServingConfig, read_env

    fields = (
        "speculative_num_draft_tokens",
        "speculative_ngram_max_trie_depth",
        "speculative_ngram_capacity",
        "speculative_ngram_max_bfs_breadth",
    )
    return ServingConfig.from_args(
        SimpleNamespace(**{f: get(f) for f in fields}), read_env().config_json
    )


def test_defaults_are_ngrams(plugins_loaded, monkeypatch):
    _, get = resolve(["--speculative-algorithm", "lookahead", "--device", "cuda"], monkeypatch)
    assert get("speculative_algorithm") == "LOOKAHEAD"
    assert get("speculative_num_draft_tokens") == 12
    assert get("max_running_requests") == 48
    assert get("enable_mixed_chunk") is False
    assert get("speculative_eagle_topk") == 10  # = --speculative-ngram-max-bfs-breadth
    assert get("speculative_num_steps") == 1
    cfg = serving_config(get)
    assert (cfg.width, cfg.budget, cfg.max_depth, cfg.capacity_nodes) == (12, 11, 18, 10_000_000)
    assert cfg.multi_branch and cfg.namespace == "extra_key" and cfg.exact_sampling


def test_our_flags_map_onto_sglangs(plugins_loaded, monkeypatch):
    argv = [
        "--speculative-algorithm", "LOOKAHEAD", "--device", "cuda",
        "--speculative-num-draft-tokens", "16",
        "--speculative-ngram-max-trie-depth", "24",
        "--speculative-ngram-capacity", "2000000",
        "--speculative-ngram-max-bfs-breadth", "1",
        "--max-running-requests", "8",
    ]  # fmt: skip
    extra = '{"budget": 9, "own_weight": 2.0, "namespace": "request", "exact_sampling": false}'
    _, get = resolve(argv, monkeypatch, extra)
    assert get("speculative_num_draft_tokens") == 16
    assert get("max_running_requests") == 8
    assert get("speculative_eagle_topk") == 1
    assert get("speculative_num_steps") == 16
    cfg = serving_config(get)
    assert (cfg.width, cfg.budget, cfg.max_depth, cfg.capacity_nodes) == (16, 9, 24, 2_000_000)
    assert not cfg.multi_branch and cfg.own_weight == 2.0
    assert cfg.namespace == "request" and not cfg.exact_sampling
    assert cfg.stats_interval_s == 60.0
    _, get = resolve(argv, monkeypatch, '{"stats_interval_s": 0}')
    assert serving_config(get).stats_interval_s == 0.0


def test_devices_other_than_cuda_and_cpu_fail_at_start_up(plugins_loaded, monkeypatch):
    from lookahead.sglang import LookaheadConfigError

    with pytest.raises(LookaheadConfigError, match="needs --device cuda or cpu, got --device xpu"):
        resolve(["--speculative-algorithm", "LOOKAHEAD", "--device", "xpu"], monkeypatch)


@pytest.mark.parametrize("asked", ["torch_native", "intel_amx"])
def test_cpu_without_amx_verifies_with_the_tree_sdpa_backend(plugins_loaded, monkeypatch, asked):
    """torch_native (SGLang's pick on a CPU without AMX, also for `intel_amx`) has no verify
    branch, so LOOKAHEAD resolves to ours; flashinfer on CUDA is left alone."""
    from lookahead.sglang.cpu_attention import TREE_SDPA_BACKEND
    from sglang.srt.runtime_context import get_platform

    monkeypatch.setitem(object.__getattribute__(get_platform(), "_overrides"), "has_amx", False)
    argv = ["--speculative-algorithm", "LOOKAHEAD", "--device", "cpu", "--attention-backend"]
    _, get = resolve(argv + [asked], monkeypatch)
    assert get("attention_backend") == TREE_SDPA_BACKEND
    _, get = resolve(["--speculative-algorithm", "LOOKAHEAD", "--device", "cuda"], monkeypatch)
    assert get("attention_backend") == "flashinfer"


def test_cpu_with_amx_keeps_intel_amx(plugins_loaded, monkeypatch):
    """intel_amx applies the tree mask in its own verify path, so it is kept."""
    from sglang.srt.runtime_context import get_platform

    monkeypatch.setitem(object.__getattribute__(get_platform(), "_overrides"), "has_amx", True)
    argv = ["--speculative-algorithm", "LOOKAHEAD", "--device", "cpu"]
    _, get = resolve(argv + ["--attention-backend", "intel_amx"], monkeypatch)
    assert get("attention_backend") == "intel_amx"


def test_dp_attention_fails_at_start_up(plugins_loaded, monkeypatch):
    from lookahead.sglang import LookaheadConfigError

    argv = ["--speculative-algorithm", "LOOKAHEAD", "--device", "cuda", "--tp-size", "2"]
    args, _ = resolve(argv, monkeypatch)  # plain TP is fine
    with pytest.raises(LookaheadConfigError, match="does not support DP attention"):
        resolve(argv + ["--attn-dp-size", "2"], monkeypatch)


def test_budget_too_large_for_the_graph_width_fails(plugins_loaded, monkeypatch):
    from lookahead.sglang import LookaheadConfigError

    argv = ["--speculative-algorithm", "LOOKAHEAD", "--device", "cuda"]
    with pytest.raises(
        LookaheadConfigError, match=r"budget=12 does not fit the CUDA-graph verify width.*12"
    ):
        resolve(argv + ["--speculative-num-draft-tokens", "12"], monkeypatch, '{"budget": 12}')
    with pytest.raises(LookaheadConfigError, match="must be an int >= 2"):
        resolve(argv + ["--speculative-num-draft-tokens", "1"], monkeypatch)
    with pytest.raises(LookaheadConfigError, match=r"capacity must be an int in \[1, 4294967293\]"):
        resolve(argv + ["--speculative-ngram-capacity", str(2**33)], monkeypatch)


@pytest.mark.parametrize(
    "config_json, message",
    [
        ("{nope", "not valid JSON"),
        ("[1]", "must be a JSON object"),
        ('{"prompt_wieght": 1}', r"unknown keys \['prompt_wieght'\]"),
        ('{"prompt_weight": 1}', "prompt_weight is now own_weight"),
        ('{"output_weight": 1}', "output_weight is now history_weight"),
        ('{"namespace": "tenant"}', "namespace must be one of"),
        ('{"history_weight": -1}', r"history_weight must be a number in \[0.0, 1e\+06\]"),
        ('{"own_weight": NaN}', "NaN is not a number"),
        ('{"history_weight": Infinity}', "Infinity is not a number"),
        ('{"own_weight": 1e7}', "own_weight must be a number in"),
        ('{"own_weight": 0, "history_weight": 0}', "cannot both be 0"),
        ('{"own_weight": 0, "namespace": "request"}', "own_weight 0 leaves out"),
        ('{"draft_threads": 100000}', r"draft_threads must be an int in \[0, 256\]"),
        ('{"exact_sampling": 1}', "exact_sampling must be true or false"),
        ('{"index_threads": 1000}', r"index_threads must be an int in \[0, 256\]"),
        ('{"history_skip": [4, 3]}', r"history_skip must be null or \[lo, hi\]"),
        ('{"history_skip": 3}', r"history_skip must be null or \[lo, hi\]"),
        ('{"stats_interval_s": -1}', r"stats_interval_s must be a number in \[0.0, 86400\]"),
        ('{"stats_interval_s": true}', "stats_interval_s must be a number in"),
    ],
)
def test_bad_lookahead_config_fails_at_start_up(plugins_loaded, monkeypatch, config_json, message):
    from lookahead.sglang import LookaheadConfigError

    with pytest.raises(LookaheadConfigError, match=message):
        resolve(
            ["--speculative-algorithm", "LOOKAHEAD", "--device", "cuda"], monkeypatch, config_json
        )


def test_ngram_is_untouched(plugins_loaded, monkeypatch):
    """The plugin changes nothing for NGRAM: CPU is still allowed there."""
    _, get = resolve(["--speculative-algorithm", "NGRAM", "--device", "cpu"], monkeypatch)
    assert get("speculative_algorithm") == "NGRAM"
    assert get("speculative_num_draft_tokens") == 12


def test_background_indexing_follows_the_model_ranks(plugins_loaded, monkeypatch):
    from lookahead.sglang import LookaheadConfigError

    def config(config_json=None):
        _, get = resolve(
            ["--speculative-algorithm", "LOOKAHEAD", "--device", "cuda"], monkeypatch, config_json
        )
        return serving_config(get)

    auto = config()
    assert auto.for_ranks(1).background_indexing is True
    assert auto.for_ranks(2).background_indexing is False  # ranks must draft alike
    on = config('{"background_indexing": true}')
    assert on.for_ranks(1) == on
    assert auto.for_ranks(1).sized_by_cost and not auto.for_ranks(2).sized_by_cost
    with pytest.raises(LookaheadConfigError, match="background_indexing true with 4 model ranks"):
        on.for_ranks(4)
    off = config('{"background_indexing": false}')
    assert off.for_ranks(8).background_indexing is False


def test_rank_refusals_come_at_start_up(plugins_loaded, monkeypatch):
    from lookahead.sglang import LookaheadConfigError

    argv = ["--speculative-algorithm", "LOOKAHEAD", "--device", "cuda"]
    with pytest.raises(LookaheadConfigError, match="background_indexing true with 2 model ranks"):
        resolve(argv + ["--tp-size", "2"], monkeypatch, '{"background_indexing": true}')
    with pytest.raises(LookaheadConfigError, match="disaggregation-mode decode"):
        resolve(argv + ["--disaggregation-mode", "decode"], monkeypatch)


def test_external_corpus_flags_are_ngrams(plugins_loaded, monkeypatch, tmp_path):
    import json

    from lookahead.sglang import LookaheadConfigError

    argv = ["--speculative-algorithm", "LOOKAHEAD", "--device", "cuda"]
    flag = "--speculative-ngram-external-corpus-path"
    with pytest.raises(LookaheadConfigError, match="External ngram corpus path does not exist"):
        resolve(argv + [flag, str(tmp_path / "none.jsonl")], monkeypatch)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('"fine"\n\n{"text": "not a string"}\n')
    with pytest.raises(LookaheadConfigError, match="record at line 3: expected a JSON string"):
        resolve(argv + [flag, str(bad)], monkeypatch)
    bad.write_text('"fine"\n"unterminated\n')
    with pytest.raises(
        LookaheadConfigError, match="Invalid JSON in external ngram corpus at line 2"
    ):
        resolve(argv + [flag, str(bad)], monkeypatch)
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps("a manual") + "\n" + json.dumps("more text") + "\n")
    # NGRAM's defaults want a SAM budget with a corpus; LOOKAHEAD has no SAM and declares one.
    args, get = resolve(argv + [flag, str(good)], monkeypatch, '{"corpus_weight": 2}')
    assert get("speculative_ngram_external_sam_budget") == 1
    with pytest.raises(ValueError, match="max-tokens must be positive"):  # NGRAM's check
        resolve(
            argv + [flag, str(good), "--speculative-ngram-external-corpus-max-tokens", "0"],
            monkeypatch,
        )
    with pytest.raises(LookaheadConfigError, match=r"corpus_weight must be a number in"):
        resolve(argv, monkeypatch, '{"corpus_weight": 0}')
    with pytest.raises(LookaheadConfigError, match="corpus_scope must be one of"):
        resolve(argv, monkeypatch, '{"corpus_scope": "tenant"}')
    with pytest.raises(LookaheadConfigError, match="keeps tenants' corpora apart by extra_key"):
        resolve(argv, monkeypatch, '{"corpus_scope": "by_id", "namespace": "shared"}')


def test_a_byte_budget_is_checked_at_start_up(plugins_loaded, monkeypatch):
    from lookahead.sglang import LookaheadConfigError

    argv = ["--speculative-algorithm", "LOOKAHEAD", "--device", "cuda"]
    for bad in ("1000", "-1", '"1GB"', "true"):
        with pytest.raises(LookaheadConfigError, match="capacity_bytes must"):
            resolve(argv, monkeypatch, f'{{"capacity_bytes": {bad}}}')
    _, get = resolve(argv, monkeypatch, '{"capacity_bytes": 67108864}')
    assert serving_config(get).capacity_bytes == 64 << 20


def test_warm_restart_paths_are_checked_at_start_up(plugins_loaded, monkeypatch, tmp_path):
    import json

    from lookahead.sglang import LookaheadConfigError

    argv = ["--speculative-algorithm", "LOOKAHEAD", "--device", "cuda"]
    missing = str(tmp_path / "none.bin")
    with pytest.raises(LookaheadConfigError, match="load: .* does not exist .*load_missing_ok"):
        resolve(argv, monkeypatch, json.dumps({"load": missing}))
    resolve(argv, monkeypatch, json.dumps({"load": missing, "load_missing_ok": True}))
    with pytest.raises(LookaheadConfigError, match="save: folder .* does not exist"):
        resolve(argv, monkeypatch, json.dumps({"save": str(tmp_path / "no" / "w.bin")}))
    with pytest.raises(LookaheadConfigError, match="save_interval_s needs save"):
        resolve(argv, monkeypatch, '{"save_interval_s": 60}')
    with pytest.raises(LookaheadConfigError, match="save_interval_s must be 0"):
        resolve(argv, monkeypatch, json.dumps({"save": missing, "save_interval_s": 0.5}))
    with pytest.raises(LookaheadConfigError, match="save must be null or a file path"):
        resolve(argv, monkeypatch, '{"save": 3}')
    with pytest.raises(LookaheadConfigError, match="2 data-parallel replicas"):
        resolve(argv + ["--dp-size", "2"], monkeypatch, json.dumps({"save": missing}))


def test_cpu_verify_width_follows_the_row_cap(plugins_loaded, monkeypatch):
    from lookahead.sglang.config import DEFAULT_CPU_VERIFY_ROWS

    _, get = resolve(["--speculative-algorithm", "LOOKAHEAD", "--device", "cuda"], monkeypatch)
    cfg = serving_config(get)  # N = 12
    want = [max(1, min(12, DEFAULT_CPU_VERIFY_ROWS // bs)) for bs in (1, 4, 16, 48)]
    assert [cfg.cpu_verify_width(bs) for bs in (1, 4, 16, 48)] == want
    assert want[0] == 12 and want[-1] == 1
    argv = ["--speculative-algorithm", "LOOKAHEAD", "--device", "cpu"]
    _, get = resolve(argv, monkeypatch, '{"max_verify_rows": 24}')
    cfg = serving_config(get)
    assert [cfg.cpu_verify_width(bs) for bs in (1, 2, 3, 8, 24, 25)] == [12, 12, 8, 3, 1, 1]


def test_max_verify_rows_is_refused_on_cuda(plugins_loaded, monkeypatch):
    from lookahead.sglang import LookaheadConfigError

    argv = ["--speculative-algorithm", "LOOKAHEAD", "--device", "cuda"]
    with pytest.raises(LookaheadConfigError, match="max_verify_rows applies to --device cpu"):
        resolve(argv, monkeypatch, '{"max_verify_rows": 64}')
    with pytest.raises(LookaheadConfigError, match=r"max_verify_rows must be an int in \[1,"):
        resolve(argv, monkeypatch, '{"max_verify_rows": 0}')
