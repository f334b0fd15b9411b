"""`python -m benchmarks llamacpp`'s bookkeeping on made-up results (the servers and the
engine are measured by the benchmark itself, not in CI)."""

from __future__ import annotations

import json

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
