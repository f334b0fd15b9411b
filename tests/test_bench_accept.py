"""The acceptance simulator end to end on small synthetic traces, and the trace helpers."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from lookahead.hf import recycling

from benchmarks import accept, traces
from benchmarks.peers import chain
from benchmarks.traces import read_traces, select_questions, spec_bench_category


def _write_traces(path, n=6, seed=0):
    rng = np.random.default_rng(seed)
    cats = ["mt_bench", "rag", "summarization"]
    with gzip.open(path, "wt") as f:
        for i in range(n):
            prompt = rng.integers(3, 40, size=60).tolist()
            out: list[int] = []
            while len(out) < 50:
                if rng.random() < 0.6:  # copy spans of the prompt, as summaries do
                    s = int(rng.integers(0, 50))
                    out += prompt[s : s + int(rng.integers(2, 9))]
                else:
                    out.append(int(rng.integers(3, 40)))
            row = {
                "question_id": i,
                "category": cats[i % 3],
                "prompt_ids": prompt,
                "output_ids": out[:50] + [2],
                "eos_token_id": 2,
            }
            f.write(json.dumps(row) + "\n")


def test_simulator_runs_and_bounds_by_the_oracle(tmp_path, capsys):
    traces = tmp_path / "t.jsonl.gz"
    _write_traces(traces)
    out = tmp_path / "r.json"
    rc = accept.main(
        [
            "--traces",
            str(traces),
            "--budgets",
            "4,8",
            "--json",
            str(out),
            "--drafters",
            "ours-multi,ours-single,vllm,vllm-1-5,pld,pld-b",
        ]
    )
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["budgets"] == [4, 8] and res["requests"] == 6
    rows = res["rows"]
    al = {(r["budget"], r["drafter"], r["category"]): r["al"] for r in rows}
    for b in (4, 8):
        oracle = al[(b, accept.ORACLE, "overall")]
        for (bb, name, cat), v in al.items():
            if bb == b:
                assert 1.0 <= v <= b + 1
                if not name.startswith("lookahead"):  # contiguous copiers: bounded per step
                    assert v <= al[(b, accept.ORACLE, cat)] + 1e-9, (name, cat)
        # Copying prompt spans is the whole game here: the oracle must find it.
        assert oracle > 1.5
    # Every step emits accepted + 1 tokens and the steps cover each output exactly.
    n_tokens = sum(
        r["tokens"]
        for r in rows
        if r["budget"] == 4 and r["category"] == "overall" and r["drafter"] == "vLLM ngram"
    )
    assert n_tokens == 6 * 50  # 51 output tokens per request, the prefill's one excluded
    over = {
        (r["budget"], r["drafter"]): r["over_oracle_steps"]
        for r in rows
        if r["category"] == "overall"
    }
    assert over[(8, "vLLM ngram")] == 0 and over[(8, "PLD")] == 0
    text = capsys.readouterr().out
    assert "copy-oracle" in text and "B = 8" in text


class _Leaky:
    """Drafts the true future: the simulator must catch it."""

    name = "leaky"

    def __init__(self, traces):
        self.outputs = [np.asarray(r["output_ids"]) for r in traces]
        self.prompt_len = {}

    def start_request(self, rid, prompt):
        self.prompt_len[rid] = len(prompt)

    def draft(self, rid, context, budget):
        pos = len(context) - self.prompt_len[rid]
        return chain(self.outputs[rid][pos : pos + budget].tolist())

    def extend(self, rid, context, new_tokens):
        pass

    def finish_request(self, rid):
        pass


def test_simulator_catches_a_future_leak(tmp_path):
    path = tmp_path / "t.jsonl.gz"
    _write_traces(path, n=2, seed=1)
    traces = read_traces(path)
    lens = accept.oracle_tables(traces, 8)
    with pytest.raises(accept.OracleViolation, match="future leak"):
        accept.run_drafter(_Leaky(traces), traces, lens, 8)


def test_simulator_rejects_bad_arguments(tmp_path):
    path = tmp_path / "t.jsonl.gz"
    _write_traces(path, n=1)
    with pytest.raises(SystemExit):
        accept.main(["--traces", str(path), "--drafters", "nope"])
    with pytest.raises(SystemExit):
        accept.main(["--traces", str(path), "--budgets", "0"])
    with pytest.raises(SystemExit):
        accept.main(["--traces", str(path), "--drafters", "vllm", "--ours-config", "x"])
    with pytest.raises(SystemExit, match="not a bool, none, number"):
        accept.main(["--traces", str(path), "--drafters", "vllm", "--ours-config", "a=b"])
    # All refused before the replay: a bad list, count, cache argument or output path.
    with pytest.raises(SystemExit):
        accept.main(["--traces", str(path), "--budgets", "8,x"])
    with pytest.raises(SystemExit, match="--per-category must be >= 0"):
        accept.main(["--traces", str(path), "--per-category", "-1"])
    for kv in ("foo=1", "max_depth=1"):
        with pytest.raises(SystemExit, match="--ours-config"):
            accept.main(["--traces", str(path), "--ours-config", kv])
    afile = tmp_path / "afile"
    afile.write_text("")
    with pytest.raises(SystemExit, match="cannot write"):
        accept.main(["--traces", str(path), "--json", str(afile / "x.json")])


def test_bench_errors_are_one_line(tmp_path, capsys):
    import benchmarks as bench

    assert bench.main(["accept", "--traces", str(tmp_path / "none.gz")]) == 1
    err = capsys.readouterr().err
    assert (
        err.startswith("python -m benchmarks accept: FileNotFoundError") and "Traceback" not in err
    )
    assert len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit):
        bench.main(["trie", "--reps", "0"])
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(SystemExit, match="not a bench's --json file"):
        bench.main(["plot", str(tmp_path / "list.json"), str(tmp_path / "x.png")])


def test_bench_interrupted_exits_130(monkeypatch, capsys):
    import benchmarks as bench
    from benchmarks import accept as accept_module

    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(accept_module, "main", interrupted)
    assert bench.main(["accept"]) == 130
    assert "interrupted" in capsys.readouterr().err


def test_ours_config_values():
    got = accept._parse_kv(["history_skip=3,6", "x=none", "b=True", "w=0.5", "d=8"])
    assert got == {"history_skip": (3, 6), "x": None, "b": True, "w": 0.5, "d": 8}


def test_read_traces_validates(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question_id": 1, "category": "qa", "prompt_ids": [1]}) + "\n")
    with pytest.raises(ValueError, match="output_ids"):
        read_traces(bad)


def test_select_questions_covers_every_category(tmp_path):
    q = tmp_path / "q.jsonl"
    lines = []
    qid = 0
    for cat in ["writing", "roleplay", "math", "coding"]:
        for _ in range(4):
            qid += 1
            lines.append({"question_id": qid, "category": cat, "turns": ["hi"]})
    for cat in ["translation", "summarization", "qa", "math_reasoning", "rag"]:
        for _ in range(8):
            qid += 1
            lines.append({"question_id": qid, "category": cat, "turns": ["hi"]})
    q.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    picked = select_questions(q, 4)
    assert len(picked) == 24
    mt = [x["category"] for x in picked if spec_bench_category(x["category"]) == "mt_bench"]
    assert mt == ["writing", "roleplay", "math", "coding"]  # evenly spaced, not the first 4
    with pytest.raises(ValueError, match="has 8 questions"):
        select_questions(q, 9)
    with pytest.raises(ValueError, match="per_category must be >= 1"):
        select_questions(q, 0)
    # Only the categories asked for need enough questions.
    only = select_questions(q, 8, ["translation", "rag"])
    assert [x["category"] for x in only] == ["translation"] * 8 + ["rag"] * 8
    # A held-out selection leaves out the questions of earlier traces.
    first = select_questions(q, 2, ["rag"])
    rest = select_questions(q, 6, ["rag"], exclude=frozenset(x["question_id"] for x in first))
    assert len(rest) == 6 and not {x["question_id"] for x in rest} & {
        x["question_id"] for x in first
    }
    with pytest.raises(ValueError, match="left after the exclusions"):
        select_questions(q, 7, ["rag"], exclude=frozenset(x["question_id"] for x in first))


def test_default_questions_from_env_else_shared_else_packaged(tmp_path, monkeypatch):
    mine = tmp_path / "mine.jsonl"
    monkeypatch.setenv("LOOKAHEAD_SPEC_BENCH", str(mine))
    assert traces.default_questions() == mine
    monkeypatch.delenv("LOOKAHEAD_SPEC_BENCH")
    # A checkout at <work>/repo: the workplace's data is <work>/shared/data/spec_bench/...
    monkeypatch.setattr(traces, "_CHECKOUT", tmp_path / "repo")
    beside = tmp_path / "shared" / traces._SHARED
    beside.parent.mkdir(parents=True)
    beside.write_text("{}\n")
    assert traces.default_questions() == beside
    monkeypatch.setattr(traces, "_SHARED", Path("data") / "absent" / "question.jsonl")
    assert traces.default_questions() == traces.PACKAGED_QUESTIONS
    assert len(select_questions(traces.PACKAGED_QUESTIONS, 20)) == 120  # works without ../shared
    monkeypatch.setattr(traces, "_CHECKOUT", Path("/"))  # a checkout at the root
    assert traces.default_questions() == traces.PACKAGED_QUESTIONS


def test_chaining_past_the_copy_oracle_is_counted_not_an_error(tmp_path):
    # A loop: the period 5..9 repeats. Chaining 2-grams walks it further than it was ever seen
    # contiguously; that is legitimate, so the run succeeds and counts the steps.
    class Chainer:
        name = "chainer"

        def start_request(self, rid, prompt):
            pass

        def draft(self, rid, context, budget):
            nxt = {int(a): int(b) for a, b in zip(context[:-1], context[1:])}
            out, t = [], int(context[-1])
            while len(out) < budget and t in nxt:
                t = nxt[t]
                out.append(t)
            return chain(out)

        def extend(self, rid, context, new_tokens):
            pass

        def finish_request(self, rid):
            pass

    path = tmp_path / "loop.jsonl"
    row = {
        "question_id": 0,
        "category": "qa",
        "prompt_ids": [1, 2],
        "output_ids": [5, 6, 7, 8, 9] * 8,
    }
    path.write_text(json.dumps(row) + "\n")
    traces = read_traces(path)
    tables = accept.oracle_tables(traces, 16)
    rows = accept.run_drafter(Chainer(), traces, tables, 16)
    assert rows[0]["over_oracle"] > 0
    assert sum(a + 1 for a in rows[0]["accepted"]) == 39


def test_drafters_take_turns_and_score_as_alone(tmp_path):
    from benchmarks.peers.ours import OursDrafter

    path = tmp_path / "t.jsonl.gz"
    _write_traces(path)
    traces = read_traces(path)
    tables = accept.oracle_tables(traces, 8)
    log = []

    class Logged(OursDrafter):
        def start_request(self, rid, prompt):
            log.append((self.name, rid))
            super().start_request(rid, prompt)

    multi, single = Logged(True), Logged(False)
    rows = accept.run_drafters([multi, single], traces, tables, 8)
    # Each drafter sees the requests in trace order; who goes first rotates per request.
    assert log == [
        (d.name, rid)
        for rid in range(6)
        for d in ((multi, single) if rid % 2 == 0 else (single, multi))
    ]
    # Taking turns changes nothing a drafter drafts: its rows equal a run alone.
    for mb, got in ((True, rows[0]), (False, rows[1])):
        alone = accept.run_drafter(OursDrafter(mb), traces, tables, 8)
        assert [r["accepted"] for r in got] == [r["accepted"] for r in alone]


def test_parse_kwargs_reads_python_literals():
    from benchmarks.harness import parse_kwargs

    assert parse_kwargs("max_depth=8,history_skip=None") == {"max_depth": 8, "history_skip": None}
    assert parse_kwargs('mode="ppm",skip=(3,6)') == {"mode": "ppm", "skip": (3, 6)}
    for bad in ("x=open('f')", "3", "a=1,2", "a=x", "a=", "**d"):
        with pytest.raises(ValueError, match="bad variant"):
            parse_kwargs(bad)


def test_command_lines_quote_and_plots_need_an_image_format(tmp_path):
    from lookahead.output import check_outputs, command_line

    assert command_line("lookahead demo", ["--prompts", "my file.jsonl"]) == (
        "lookahead demo --prompts 'my file.jsonl'"
    )
    check_outputs(tmp_path / "a.json", plot=tmp_path / "a.png")
    for bad in ("a.txt", "a.json", "a"):
        with pytest.raises(SystemExit, match="cannot draw"):
            check_outputs(tmp_path / "a.json", plot=tmp_path / bad)


def test_traces_refuses_bad_exclude_files_before_the_model_loads(tmp_path, monkeypatch):
    monkeypatch.setattr("lookahead.models.load_model", lambda *a, **k: 1 / 0)
    good = tmp_path / "t.jsonl.gz"
    _write_traces(good, n=2)
    truncated = tmp_path / "cut.jsonl.gz"
    truncated.write_bytes(good.read_bytes()[:40])
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"question_id": 0, "category": "rag", "turns": ["hi"]}) + "\n")
    base = ["--questions", str(q), "--per-category", "1", "--out", str(tmp_path / "o.jsonl.gz")]
    for bad, match in (
        (truncated, "ended before"),
        (tmp_path / "absent.jsonl.gz", "No such file"),
        (good, "has 0 questions left after the exclusions < 1"),
    ):
        with pytest.raises(SystemExit, match=match):
            traces.main([*base, "--exclude", str(bad)])


def _with_topk(path, k=3, seed=0):
    """The traces at `path` with synthetic top-k rows (row i: after token i; its top-1 the
    next token, as a greedy trace's is)."""
    rng = np.random.default_rng(seed)
    rows = read_traces(path)
    for r in rows:
        full = r["prompt_ids"] + r["output_ids"]
        ids = [
            [full[i + 1], *rng.integers(3, 40, size=k - 1).tolist()] for i in range(len(full) - 1)
        ]
        r["topk_ids"] = ids
        r["topk_p16"] = [[40000, 10000, 5000][:k] for _ in ids]
    traces.write_traces(path, rows)
    return read_traces(path)


class _Spy:
    """A recycling drafter that checks it is handed only the rows of verified positions."""

    name = "spy"
    recycles = True

    def __init__(self, rows, prompt_rows):
        self.rows = rows
        self.prompt_rows = prompt_rows
        self.seen = 0

    def start_request(self, rid, prompt, predictions=None):
        ids, p = predictions
        # The prefill's rows of the last prompt tokens, not the last token's.
        n = min(self.prompt_rows, len(prompt) - 1)
        want = self.rows[rid]["topk_ids"][len(prompt) - 1 - n : len(prompt) - 1]
        assert np.array_equal(ids, np.asarray(want))

    def draft(self, rid, context, budget):
        return [], []

    def extend(self, rid, context, new_tokens, predictions):
        ids, p = predictions
        at = len(context) - 1  # row `at` chose the first new token
        assert np.array_equal(
            ids, np.asarray(self.rows[rid]["topk_ids"][at : at + len(new_tokens)])
        )
        assert np.allclose(
            p, np.asarray(self.rows[rid]["topk_p16"][at : at + len(new_tokens)]) / traces.P16_SCALE
        )
        assert np.array_equal(ids[:, 0], new_tokens)  # each row chose its token
        self.seen += len(new_tokens)

    def finish_request(self, rid):
        pass


@pytest.mark.parametrize("prompt_rows", [10, 512])
def test_a_recycling_replay_is_handed_only_verified_rows(tmp_path, monkeypatch, prompt_rows):
    monkeypatch.setattr(recycling, "RECYCLE_PROMPT_ROWS", prompt_rows)
    path = tmp_path / "t.jsonl.gz"
    _write_traces(path, n=3)
    rows = _with_topk(path)
    spy = _Spy(rows, prompt_rows)
    accept.run_drafter(spy, rows, accept.oracle_tables(rows, 8), 8)
    assert spy.seen == sum(len(r["output_ids"]) for r in rows)


def test_ours_recycled_replays_and_needs_top_k(tmp_path):
    path = tmp_path / "t.jsonl.gz"
    _write_traces(path, n=3)
    with pytest.raises(SystemExit, match="--add-topk"):
        accept.main(["--traces", str(path), "--budgets", "8", "--drafters", "ours-recycled"])
    # The target follows a rule no text shows before the output: after token x comes g(x), a
    # 37-cycle over 3..39. The prompt is random; the target's rows after each prompt token
    # already name g(x), so recycling them drafts the output from its start.
    rng = np.random.default_rng(4)
    g = dict(zip(range(3, 40), [*range(4, 40), 3]))
    rows = []
    for i in range(3):
        prompt = rng.integers(3, 40, size=60).tolist()
        out = [int(rng.integers(3, 40))]
        while len(out) < 30:
            out.append(g[out[-1]])
        full = prompt + out
        rows.append(
            {
                "question_id": i,
                "category": "qa",
                "prompt_ids": prompt,
                "output_ids": out,
                "topk_ids": [[g[t], 3, 4] for t in full[:-1]],
                "topk_p16": [[52000, 6000, 3000]] * (len(full) - 1),
            }
        )
    traces.write_traces(path, rows)
    out = tmp_path / "r.json"
    argv = ["--traces", str(path), "--budgets", "8", "--json", str(out)]
    assert accept.main([*argv, "--drafters", "ours-multi,ours-recycled"]) == 0
    al = {
        r["drafter"]: r["al"]
        for r in json.loads(out.read_text())["rows"]
        if r["category"] == "overall"
    }
    assert al["lookahead multi +recycled"] > 1.5 * al["lookahead multi"]


def test_traces_record_the_targets_top_k():
    import torch
    from tiny_models import hf_generate, tiny_model

    model = tiny_model("llama", seed=3)
    prompt = [5, 6, 7, 5, 6, 7, 5, 6]
    rows = [{"prompt_ids": prompt, "output_ids": hf_generate(model, prompt, 12)}]
    meta = traces.add_topk(rows, model, 4, progress=False)
    assert meta == {"topk": 4, "top1_equals_output": 12, "output_tokens": 12}
    r = rows[0]
    assert len(r["topk_ids"]) == len(r["topk_p16"]) == len(prompt) + 12 - 1
    assert all(len(x) == 4 for x in r["topk_ids"])
    with torch.inference_mode():
        ref = torch.softmax(model(input_ids=torch.tensor([prompt])).logits[0], -1).topk(4)
    assert r["topk_ids"][: len(prompt)] == ref.indices.tolist()
    p = np.asarray(r["topk_p16"][: len(prompt)]) / traces.P16_SCALE
    assert np.allclose(p, ref.values.numpy(), atol=1e-4)
