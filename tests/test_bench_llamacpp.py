"""`python -m benchmarks llamacpp`'s bookkeeping on made-up results (the servers and the
engine are measured by the benchmark itself, not in CI)."""

from __future__ import annotations

import json

import pytest

from benchmarks import llamacpp


def test_server_rows_and_the_summary_by_spec_bench_category(tmp_path, capsys):
    resp = {"tokens": [1, 2, 3, 4, 5], "timings": {"predicted_ms": 40.0, "draft_n": 6,
            "draft_n_accepted": 3}}  # fmt: skip
    row = llamacpp.server_row(resp)
    assert row["n"] == 5 and row["decode_s"] == 0.04 and (row["drafted"], row["accepted"]) == (6, 3)

    def method(tps, n, **kw):
        return {"tps": tps, "n": n, "identical": kw.pop("identical", True), **kw}

    rows = [
        {"category": "writing", "methods": {"plain": method(10.0, 9),
         "lookahead": method(20.0, 9, steps=3, drafted=8, accepted=6, host_overhead=0.02)}},
        {"category": "rag", "methods": {  # the second prompt ran the methods rotated
         "lookahead": method(5.0, 9, steps=9, drafted=2, accepted=0, host_overhead=0.04,
                             identical=False), "plain": method(10.0, 9)}},
    ]  # fmt: skip
    result = {"quant": "q4_1", "model": "m.gguf", "rows": rows, "llama_bench": {"1": 0.01, "2": 0.015},
              "start_up_costs": {"widths": [1, 2], "ms": [[10.0, 16.0]]}, "learned_costs": None}  # fmt: skip
    summary = llamacpp.summarize(result)
    by = {(s["category"], s["method"]): s for s in summary}
    # every category lists the methods in the first prompt's (unrotated) order
    assert [(s["category"], s["method"]) for s in summary if s["category"] == "rag"] == [
        ("rag", "plain"),
        ("rag", "lookahead"),
    ]
    # MT-bench's subcategories count as mt_bench, as in every Spec-Bench table here
    assert by[("mt_bench", "lookahead")]["tokens_per_step"] == 3.0
    over = by[("overall", "lookahead")]
    assert over["median_vs_plain"] == 1.25 and over["identical"] == 1 and over["drafted"] == 10
    assert over["host_overhead"] == 0.03 and by[("overall", "plain")]["tokens_per_step"] == 1.0
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"argv": [], "results": [result]}))
    assert llamacpp.main(["--report", str(path)]) == 0
    out = capsys.readouterr().out
    assert "W=2 1.50x" in out and "W=2 1.60x" in out and "identical 1/2" in out


def test_same_text_compares_only_prompts_both_decoded_as_plain_did():
    def method(n, s, identical=True):
        return {"n": n, "decode_s": s, "tps": n / s, "identical": identical}

    rows = [  # 1: both as plain; 2: the speculator forked; 3: lookahead forked
        {"category": "rag", "methods": {"plain": method(10, 1.0), "ngram-mod": method(10, 0.5),
         "plain (fa auto)": method(10, 0.9, False), "plain (engine)": method(10, 1.0),
         "lookahead": method(10, 0.4)}},
        {"category": "rag", "methods": {"plain": method(10, 1.0), "ngram-mod": method(30, 0.1, False),
         "plain (fa auto)": method(10, 0.9), "plain (engine)": method(10, 1.0),
         "lookahead": method(10, 0.5)}},
        {"category": "qa", "methods": {"plain": method(20, 1.0), "ngram-mod": method(20, 1.0),
         "plain (fa auto)": method(10, 0.9), "plain (engine)": method(10, 1.0),
         "lookahead": method(20, 0.1, False)}},
    ]  # fmt: skip
    (row,) = llamacpp.same_text({"rows": rows})  # plain, fa auto and the engines are no speculators
    assert row["method"] == "ngram-mod" and row["prompts"] == 1
    assert (row["lookahead_tps"], row["tps"], row["plain_tps"]) == (25.0, 20.0, 10.0)
    rows[0]["methods"]["ngram-mod"]["identical"] = False
    assert llamacpp.same_text({"rows": rows}) == []  # no prompt both decoded as plain did


def test_speculator_host_reads_the_last_cumulative_line_of_each_implementation(tmp_path):
    line = ("0.01.215.245 I spec common_specu: statistics {:>16}: #calls(b,g,a) = {:4d} {:6d} "
            "{:6d}, #gen drafts = 6, #acc drafts = 6, #gen tokens = 47, #acc tokens = 40, "
            "#mean acc len = 7.67, #acc rate/pos = (1.000, 0.833), dur(b,g,a) = {}, {}, {} ms")  # fmt: skip
    log = tmp_path / "s.log"
    log.write_text("\n".join([
        "0.00.1 I srv  llama_server: listening",
        line.format("ngram-mod", 1, 87, 6, "0.033", "0.243", "0.008"),
        line.format("ngram-mod", 2, 124, 18, "0.111", "0.370", "0.018"),  # cumulative: this one
        line.format("ngram-simple", 2, 100, 10, "0.010", "0.100", "0.090"),
    ]))  # fmt: skip
    h = llamacpp.speculator_host(log)
    assert h["calls"] == [4, 224, 28] and h["ms"] == pytest.approx([0.121, 0.47, 0.108])
    (tmp_path / "plain.log").write_text("0.00.1 I srv  llama_server: listening\n")
    assert llamacpp.speculator_host(tmp_path / "plain.log") is None

    rows = [{"methods": {"lookahead": {"drafter_s": 0.002, "steps": 10}}},
            {"methods": {"lookahead": {"drafter_s": 0.001, "steps": 20}}}]  # fmt: skip
    times = llamacpp.drafter_times({"rows": rows, "speculator_host": {"ngram-mod": h}})
    assert times[0] == ("lookahead", pytest.approx(100.0), None)  # 3 ms over 30 steps
    assert times[1] == ("ngram-mod", pytest.approx(1e3 * 0.578 / 224), pytest.approx(121 / 4))
    del rows[1]["methods"]["lookahead"]["drafter_s"]  # a run from before: none for lookahead
    assert [t[0] for t in llamacpp.drafter_times({"rows": rows})] == []
