"""What an operator meets on a real SGLang 0.5.23 CPU server serving LOOKAHEAD: constrained
requests (JSON schema, regex, EBNF through xgrammar), per-request switches in
`custom_params`, and the plugin's Prometheus series with `--enable-metrics`.

Servers as in `test_server_cpu.py` (`cpu_server.py`: subprocess on 127.0.0.1, bounded
start-up, torn down). Every greedy output must equal a server without speculation's.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("sglang", reason="needs sglang==0.5.23: requirements/sglang-test.txt")

from cpu_server import CpuServer, save_tiny_model  # noqa: E402

WIDTH = 8
LOOKAHEAD = [
    "--speculative-algorithm",
    "LOOKAHEAD",
    "--speculative-num-draft-tokens",
    str(WIDTH),
    "--enable-metrics",
]
PROMPTS = [
    "abcabcabcabcabc",
    "the cat sat on the mat. the cat sat on the mat. the cat",
    "to be or not to be, to be or not to be, that is",
    '{"a": "abc", "b": true} {"a": "abd", "b": false} {"a": "abc", "b": true}',
]
SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "string", "enum": ["abc", "abd"]}, "b": {"type": "boolean"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
REGEX = "[a-c]{20}"
EBNF = 'root ::= "x" ("ab")* "y"'
EBNF_RE = "x(ab)*y"
GRAMMARS = {
    "json_schema": {"json_schema": json.dumps(SCHEMA)},
    "regex": {"regex": REGEX},
    "ebnf": {"ebnf": EBNF},
}
MAX_NEW = 48


def accepted(meta: dict) -> int:
    return int(meta.get("spec_num_correct_drafts", 0))


def follows(kind: str, text: str) -> bool:
    """Whether a finished constrained answer is in its grammar's language."""
    if kind == "regex":
        return re.fullmatch(REGEX, text) is not None
    if kind == "ebnf":
        return re.fullmatch(EBNF_RE, text) is not None
    try:
        obj = json.loads(text)
    except ValueError:
        return False
    return set(obj) == {"a", "b"} and obj["a"] in ("abc", "abd") and isinstance(obj["b"], bool)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("llama"), "llama")


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    return tmp_path_factory.mktemp("production_logs")


@pytest.fixture(scope="module")
def plain(model, logs):
    with CpuServer(model, [], logs / "plain.log") as s:
        yield s


@pytest.fixture(scope="module")
def lookahead(model, logs):
    # The default CPU sizer chooses each step's width (so rows cut before the verify are
    # rows not paid for).
    env = {"LOOKAHEAD_CONFIG": json.dumps({"stats_interval_s": 0.2})}
    with CpuServer(model, LOOKAHEAD, logs / "lookahead.log", env=env) as s:
        yield s


@pytest.fixture(scope="module")
def reference(plain):
    memo: dict = {}

    def ref(text: str, **params):
        key = (text, json.dumps(params, sort_keys=True))
        if key not in memo:
            memo[key] = plain.generate(text, **params)
        return memo[key]

    return ref


def fresh_gauges(server: CpuServer, **params) -> dict[str, float]:
    """Gauges are refreshed at most once a second, at a decode step: wait, decode a little."""
    time.sleep(1.2)
    server.generate("abcabc", max_new_tokens=8, **params)
    return server.metrics()


# -- structured output ----------------------------------------------------------------------


@pytest.mark.parametrize("concurrency", [1, 4])
def test_constrained_greedy_equals_no_speculation(lookahead, reference, concurrency):
    """JSON schema, regex and EBNF requests, alone and beside unconstrained ones."""
    jobs = [(p, kind, GRAMMARS[kind]) for p in PROMPTS for kind in GRAMMARS]
    jobs += [(p, None, {}) for p in PROMPTS[:2]]  # unconstrained ones in the same batches
    with ThreadPoolExecutor(concurrency) as pool:
        outs = list(
            pool.map(lambda j: lookahead.generate(j[0], max_new_tokens=MAX_NEW, **j[2]), jobs)
        )
    for (p, kind, params), out in zip(jobs, outs):
        want = reference(p, max_new_tokens=MAX_NEW, **params)
        assert out["output_ids"] == want["output_ids"], (p, kind)
        if kind and out["meta_info"]["finish_reason"]["type"] == "stop":
            assert follows(kind, out["text"]), (kind, out["text"])
    assert sum(accepted(o["meta_info"]) for o in outs) > 0


def test_constrained_sampled_requests_sample_within_the_grammar(lookahead, reference):
    """Sampled constrained requests go through the exact tree sampler with the grammar's
    mask (SGLang's own CPU verify is argmax: before, they came out greedy): top-k 1 gives
    the greedy answer, temperature 1.5 gives other answers, every finished one in the
    grammar's language."""
    finished, differ = 0, 0
    for kind, params in GRAMMARS.items():
        p = PROMPTS[3] if kind == "json_schema" else PROMPTS[0]
        want = reference(p, max_new_tokens=MAX_NEW, **params)
        out = lookahead.generate(p, max_new_tokens=MAX_NEW, temperature=1.0, top_k=1, **params)
        assert out["output_ids"] == want["output_ids"], kind
        for seed in range(4):
            hot = lookahead.generate(
                p, max_new_tokens=MAX_NEW, temperature=1.5, sampling_seed=seed, **params
            )
            differ += hot["output_ids"] != want["output_ids"]
            if hot["meta_info"]["finish_reason"]["type"] == "stop":
                finished += 1
                assert follows(kind, hot["text"]), (kind, hot["text"])
    assert finished >= 3, "too few sampled constrained answers finished to check them"
    assert differ >= 6, "sampled constrained answers are the greedy ones: argmax verify?"


def test_drafts_the_grammar_forbids_are_cut_before_the_verify(lookahead, reference):
    """The prompt's n-grams hold `{`, `"`, `:` and spaces the regex [a-c]{20} forbids: they
    are pruned on the host (`lookahead_cut_nodes_total`), and the output stays exact."""
    p = '{"a": "abc", "b": true} abcabc {"a": "abc", "b": true} abcabc {"a": "abc"'
    before = lookahead.metrics()
    out = lookahead.generate(p, max_new_tokens=MAX_NEW, regex=REGEX)
    after = lookahead.metrics()
    assert out["output_ids"] == reference(p, max_new_tokens=MAX_NEW, regex=REGEX)["output_ids"]
    assert after["lookahead_cut_nodes_total"] > before["lookahead_cut_nodes_total"]


def test_top_p_top_k_and_min_p_requests_sample_on_cpu(lookahead):
    """Top-p, top-k and min-p sampled requests, constrained or not, beside greedy ones: the
    exact sampler filters them as SGLang's CPU sampler does (before, a top-p request ended
    the scheduler: SGLang has no CPU top-p renorm kernel; found by the soak)."""
    params = [
        {"top_p": 0.9},
        {"top_p": 0.8, "top_k": 5},
        {"min_p": 0.1},
        {"top_p": 0.95, **GRAMMARS["regex"]},
    ]
    with ThreadPoolExecutor(4) as pool:
        outs = list(
            pool.map(
                lambda sp: lookahead.generate(
                    PROMPTS[0], max_new_tokens=MAX_NEW, **{"temperature": 0.8, **sp}
                ),
                params + [{"temperature": 0}],
            )
        )
    for sp, out in zip(params, outs):
        assert out["output_ids"], sp
    assert re.fullmatch(REGEX, outs[3]["text"]), outs[3]["text"]


# -- per-request switches ------------------------------------------------------------------


def switch(**values) -> dict:
    return {"custom_params": {"lookahead": values}}


def test_a_request_switched_off_drafts_nothing_in_a_mixed_batch(lookahead, reference):
    jobs = [(PROMPTS[i % 3], i % 2 == 0) for i in range(8)]  # (prompt, speculation on)
    with ThreadPoolExecutor(8) as pool:
        outs = list(
            pool.map(
                lambda j: lookahead.generate(
                    j[0], max_new_tokens=MAX_NEW, **({} if j[1] else switch(enabled=False))
                ),
                jobs,
            )
        )
    for (p, on), out in zip(jobs, outs):
        assert out["output_ids"] == reference(p, max_new_tokens=MAX_NEW)["output_ids"], p
        if not on:
            assert accepted(out["meta_info"]) == 0, out["meta_info"]
    assert sum(accepted(o["meta_info"]) for (_, on), o in zip(jobs, outs) if on) > 0


def test_a_request_budget_caps_its_drafts(lookahead, reference):
    p = PROMPTS[0]
    want = reference(p, max_new_tokens=MAX_NEW)["output_ids"]
    one = lookahead.generate(p, max_new_tokens=MAX_NEW, **switch(budget=1))
    assert one["output_ids"] == want
    meta = one["meta_info"]
    # At most one drafted token accepted per step.
    assert accepted(meta) <= meta["spec_verify_ct"], meta
    zero = lookahead.generate(p, max_new_tokens=MAX_NEW, **switch(budget=0, enabled=True))
    assert zero["output_ids"] == want and accepted(zero["meta_info"]) == 0


def test_a_pinned_namespace_joins_that_namespace(lookahead):
    """Requests of new tenants pinned to one namespace add no namespace; unpinned, each
    tenant's requests get their own (namespace mode "extra_key")."""
    pin = switch(namespace="pinned-tenant")
    # The gauges are read before a step indexes new requests: the namespace exists first.
    lookahead.generate(PROMPTS[1], max_new_tokens=16, **pin)
    start = fresh_gauges(lookahead, **pin)["lookahead_namespaces"]
    for i in range(3):
        lookahead.generate(PROMPTS[1], max_new_tokens=16, extra_key=f"new-{i}", **pin)
    pinned = fresh_gauges(lookahead, **pin)["lookahead_namespaces"]
    for i in range(3):
        lookahead.generate(PROMPTS[1], max_new_tokens=16, extra_key=f"own-{i}")
    unpinned = fresh_gauges(lookahead, **pin)["lookahead_namespaces"]
    assert pinned == start
    assert unpinned == start + 3


@pytest.mark.parametrize(
    "value, message",
    [
        ({"budget": WIDTH}, "budget must be an int in [0, 7]"),
        ({"enabled": "no"}, "enabled must be true or false"),
        ({"namespace": ""}, "namespace must be a string of 1 to 128"),
        ({"speed": 2}, "unknown key(s) ['speed']"),
        ("fast", 'custom_params["lookahead"] must be an object'),
    ],
)
def test_a_bad_switch_fails_that_request_alone(lookahead, reference, value, message):
    good = [PROMPTS[0], PROMPTS[1]]

    def bad():
        body = {
            "text": PROMPTS[2],
            "sampling_params": {"max_new_tokens": MAX_NEW, "custom_params": {"lookahead": value}},
        }
        req = urllib.request.Request(
            lookahead.url + "/generate",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=120):
                return "served"
        except urllib.error.HTTPError as e:
            return f"HTTP {e.code}: {json.loads(e.read())['error']['message']}"

    with ThreadPoolExecutor(3) as pool:
        futs = [pool.submit(lookahead.generate, p, max_new_tokens=MAX_NEW) for p in good]
        err = pool.submit(bad).result()
        outs = [f.result() for f in futs]
    assert "HTTP 400" in err and message in err, err
    for p, out in zip(good, outs):
        assert out["output_ids"] == reference(p, max_new_tokens=MAX_NEW)["output_ids"]


# -- metrics -------------------------------------------------------------------------------


def test_metrics_move_with_the_traffic(lookahead):
    with urllib.request.urlopen(lookahead.url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    assert "# TYPE lookahead_verify_steps_total counter" in text
    assert "# TYPE lookahead_trie_nodes gauge" in text
    before = lookahead.metrics()
    out = lookahead.generate(PROMPTS[0], max_new_tokens=MAX_NEW, ignore_eos=True)
    after = lookahead.metrics()
    meta = out["meta_info"]
    moved = {k: after[k] - before.get(k, 0.0) for k in after}
    assert moved["lookahead_verify_steps_total"] == meta["spec_verify_ct"], (moved, meta)
    assert moved["lookahead_accepted_tokens_total"] == accepted(meta) > 0, (moved, meta)
    # Every verify step emits its accepted tokens and one more (the last may pass the limit).
    emitted = moved["lookahead_emitted_tokens_total"]
    assert meta["completion_tokens"] - 1 <= emitted <= meta["completion_tokens"] - 1 + WIDTH
    assert moved["lookahead_request_steps_total"] == meta["spec_verify_ct"]  # alone
    assert moved["lookahead_verify_rows_total"] >= moved["lookahead_verify_steps_total"]
    assert moved["lookahead_draft_nodes_total"] >= moved["lookahead_accepted_tokens_total"]
    gauges = fresh_gauges(lookahead)
    assert gauges["lookahead_trie_nodes"] > 0 and gauges["lookahead_trie_bytes"] > 0
    assert gauges["lookahead_trie_capacity_nodes"] >= gauges["lookahead_trie_nodes"]
    assert gauges["lookahead_live_requests"] >= 1
