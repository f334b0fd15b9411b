"""Input from outside refused within bounded time and memory: files that are not regular
files, files past their size, JSON that `json` takes but no file of ours holds (NaN, huge
integers, deep nesting, repeated keys), and what reads them (cost files, prompt files,
LOOKAHEAD_CONFIG, --threads, --json into a FIFO)."""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace

import pytest
from bounded import quickly
from lookahead import costs, output
from lookahead.args import max_threads
from lookahead.cli import main as cli_main
from lookahead.demo import load_prompts
from lookahead.sglang.config import LookaheadConfigError, ServingConfig
from lookahead.user_input import (
    MAX_JSON_DEPTH,
    QUOTE_CHARS,
    UserInputError,
    loads_json,
    read_file,
)


# -- files -------------------------------------------------------------------------------
def test_a_regular_file_is_read_within_its_limit(tmp_path):
    f = tmp_path / "f"
    f.write_bytes(b"x" * 100)
    assert read_file(f, 100, "test file") == b"x" * 100
    with pytest.raises(UserInputError, match="has 100 bytes; at most 99"):
        read_file(f, 99, "test file")
    with pytest.raises(FileNotFoundError):
        read_file(tmp_path / "missing", 10, "test file")


def test_special_files_are_refused_without_blocking(tmp_path, fifo):
    link = tmp_path / "zero"
    link.symlink_to("/dev/zero")
    for path in (fifo, link, tmp_path, "/dev/null"):
        with pytest.raises(UserInputError, match="not a regular file"):
            quickly(lambda p=path: read_file(p, 1 << 20, "test file"))


# -- JSON --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, why",
    [
        ('{"a": NaN}', "NaN is not a number"),
        ("[Infinity]", "Infinity is not a number"),
        ("[-Infinity]", "-Infinity is not a number"),
        ("[1e999]", "overflows a float"),
        ("[" + "7" * 5000 + "]", "an integer of 5000 digits"),
        ('{"a": 1, "a": 2}', "key 'a' appears twice"),
        ("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1), "nested deeper than"),
        ("[" * 200_000 + "]" * 200_000, "nested deeper than"),  # RecursionError in json
        ("{", "not valid JSON"),
        (b"\xff\xfe", "not UTF-8"),
    ],
)
def test_json_that_no_file_of_ours_holds_is_refused(text, why):
    with pytest.raises(UserInputError, match=why):
        quickly(lambda: loads_json(text, "test"))


def test_json_within_the_bounds_is_read_as_json_reads_it():
    text = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert loads_json(text, "test") == json.loads(text)
    doc = '{"a": [1, 2.5, -3e10, "x", null, true], "b": {"c": 18446744073709551615}}'
    assert loads_json(doc, "test") == json.loads(doc)


def test_a_long_bad_value_is_quoted_short():
    with pytest.raises(LookaheadConfigError) as e:
        ServingConfig.from_args(ARGS, json.dumps({"namespace": "t" * 60_000}))
    assert len(str(e.value)) < 4 * QUOTE_CHARS + 200
    assert "60000 characters" in str(e.value)


# -- what reads them ---------------------------------------------------------------------
ARGS = SimpleNamespace(
    speculative_num_draft_tokens=8,
    speculative_ngram_max_trie_depth=8,
    speculative_ngram_capacity=100_000,
    speculative_ngram_max_bfs_breadth=4,
)


@pytest.mark.parametrize(
    "config, why",
    [
        ('{"budget": ' + "[" * 30_000 + "]" * 30_000 + "}", "nested deeper than"),
        ('{"budget": ' + "9" * 5000 + "}", "an integer of 5000 digits"),
        ('{"budget": 3, "budget": 4}', "key 'budget' appears twice"),
        ('{"stats_interval_s": 1e-300}', "stats_interval_s must be 0 .off. or at least 0.1"),
        ('{"own_weight": 1e999}', "overflows a float"),
        (" " * (1 << 17), "characters; at most"),
    ],
)
def test_hostile_lookahead_configs_are_config_errors(config, why):
    with pytest.raises(LookaheadConfigError, match=why):
        quickly(lambda: ServingConfig.from_args(ARGS, config))


def test_stats_interval_zero_still_turns_the_log_off():
    assert ServingConfig.from_args(ARGS, '{"stats_interval_s": 0}').stats_interval_s == 0


COST = {
    "format": costs.COST_FORMAT,
    "key": {"k": 1},
    "widths": [1, 2],
    "contexts": [128],
    "ms": [[10.0, 15.0]],
}


@pytest.mark.parametrize(
    "change",
    [
        {"widths": [1, 10**12]},  # a 7 TiB curve
        {"widths": [1, 1_000_000]},  # 4 GB of curves by 8k tokens of context
        {"widths": list(range(1, 1000)), "ms": [[1.0] * 999]},
        {"contexts": [10**18]},
        {"ms": [[10.0, 1e300]]},
        {"ms": [[10.0, True]]},
        {"widths": "12"},
        {"key": [1]},
    ],
)
def test_hostile_cost_files_are_measured_again(tmp_path, change):
    path = tmp_path / "cost.json"
    path.write_text(json.dumps({**COST, **change}))
    said = []
    assert costs._read(path, COST["key"], said.append) is None
    assert said and "re-measuring" in said[0]
    path.write_text(json.dumps(COST))
    assert costs._read(path, COST["key"], said.append) is not None  # the good one is read


def test_special_and_huge_cost_files_are_measured_again(tmp_path, fifo):
    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (costs.MAX_FILE_BYTES + 1))
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    inf = tmp_path / "inf.json"
    inf.write_text(json.dumps(COST).replace("[128]", "[Infinity]"))
    for path in (fifo, zero, big, deep, inf):
        said = []
        assert quickly(lambda p=path, s=said: costs._read(p, COST["key"], s.append)) is None
        assert said and "re-measuring" in said[0], path


def test_hostile_prompt_files_are_one_error(tmp_path, fifo):
    zero = tmp_path / "zero.jsonl"
    zero.symlink_to("/dev/zero")
    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"turns": ["hi"]}\n' + "[" * 100_000 + "]" * 100_000 + "\n")
    dup = tmp_path / "dup.jsonl"
    dup.write_text('{"turns": ["a"], "turns": ["b"]}\n')
    for path, why in [
        (fifo, "not a regular file"),
        (zero, "not a regular file"),
        (deep, "line 2: nested deeper than"),
        (dup, "line 1: key 'turns' appears twice"),
    ]:
        with pytest.raises(ValueError, match=why):
            quickly(lambda p=path: load_prompts(p))


def test_threads_past_the_bound_are_refused_before_anything_loads(capsys):
    assert 1 <= max_threads() <= 256
    assert cli_main(["demo", "--threads", str(max_threads() + 1)]) == 2
    assert "--threads must be in [1, " in capsys.readouterr().err


def test_json_into_a_fifo_without_a_reader_fails_in_bounded_time(fifo, monkeypatch):
    monkeypatch.setattr(output, "FIFO_READER_WAIT_S", 0.2)
    t0 = time.monotonic()
    with pytest.raises(OSError, match="no reader opened the FIFO within 0.2 s"):
        quickly(lambda: output.write_output(fifo, "{}"))
    assert time.monotonic() - t0 < 3

    got = []  # with a reader it is written as before
    reader = threading.Thread(target=lambda: got.append(open(fifo).read()), daemon=True)
    reader.start()
    quickly(lambda: output.write_output(fifo, '{"a": 1}'))
    reader.join(5)
    assert got == ['{"a": 1}']


# -- fuzz: every reader of outside bytes fails with its one error type, or reads ------------
def _mutations():
    from hypothesis import strategies as st

    good_cost = json.dumps(COST).encode()
    good_prompt = b'{"turns": ["hello"], "category": "rag"}\n'
    good_config = b'{"budget": 4, "namespace": "shared", "history_skip": [3, 6]}'
    base = st.sampled_from([good_cost, good_prompt, good_config])

    def truncate(b, i):
        return b[: i % (len(b) + 1)]

    def flip(b, i, x):
        if not b:
            return b
        i %= len(b)
        return b[:i] + bytes([b[i] ^ (x | 1)]) + b[i + 1 :]

    def nest(b, n):
        return b"[" * n + b + b"]" * n

    def splice(b, i, junk):
        i %= len(b) + 1
        return b[:i] + junk + b[i:]

    junk = st.sampled_from(
        [
            b"NaN",
            b"Infinity",
            b"1e999",
            b"9" * 5000,
            b'"a": 1, "a": 2',
            b"[" * 5000,
            b"\xff",
            b"\x00",
        ]
    )
    i = st.integers(0, 10_000)
    return st.one_of(
        st.binary(max_size=512),
        st.builds(truncate, base, i),
        st.builds(flip, base, i, st.integers(0, 255)),
        st.builds(nest, base, st.integers(0, 3000)),
        st.builds(splice, base, i, junk),
    )


def test_file_readers_fail_with_their_one_error_type(tmp_path):
    from hypothesis import HealthCheck, given, settings
    from lookahead import LookaheadCache, LookaheadError

    path = tmp_path / "input"

    @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
    @given(_mutations())
    def check(data):
        path.write_bytes(data)
        got = costs._read(path, COST["key"], None)  # never raises: None is "measure again"
        assert got is None or isinstance(got, costs.CostModel)
        try:
            load_prompts(path)
        except ValueError:
            pass
        try:
            ServingConfig.from_args(ARGS, data.decode("utf-8", "surrogateescape"))
        except LookaheadConfigError:
            pass
        try:
            LookaheadCache.load(path)
        except LookaheadError:
            pass

    quickly(check, 60.0)
