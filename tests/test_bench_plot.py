"""The benches' PNG charts: drawn with `--plot` at the end of a run, and redrawn from a saved
`--json` file by `python -m benchmarks plot`."""

from __future__ import annotations

import json

import pytest
from test_bench_accept import _write_traces

from benchmarks import accept, plot, trie
from benchmarks import main as bench_main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

pytest.importorskip("matplotlib")


def _is_png(path) -> bool:
    return path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 10_000


def test_accept_plots_and_replots_from_its_json(tmp_path):
    traces = tmp_path / "t.jsonl.gz"
    _write_traces(traces)
    out, png, again = tmp_path / "r.json", tmp_path / "a.png", tmp_path / "b.png"
    argv = ["--traces", str(traces), "--budgets", "4,8", "--drafters", "ours-multi,vllm,pld"]
    assert accept.main([*argv, "--json", str(out), "--plot", str(png)]) == 0
    assert _is_png(png)
    assert bench_main(["plot", str(out), str(again)]) == 0
    assert _is_png(again)


def test_trie_quick_writes_its_context_and_a_chart(tmp_path):
    out, png = tmp_path / "t.json", tmp_path / "t.png"
    assert trie.main(["--quick", "--json", str(out), "--plot", str(png)]) == 0
    res = json.loads(out.read_text())
    # Every result file says what made it, where and with which versions.
    assert res["bench"] == "trie" and res["command"].startswith("python -m benchmarks trie --quick")
    assert {"date", "git", "machine", "versions", "loadavg"} <= set(res)
    assert {r["what"] for r in res["rows"]} >= {"index_prompt", "add_history", "draft"}
    assert _is_png(png)
    again = tmp_path / "again.png"
    assert plot.main([str(out), str(again)]) == 0 and _is_png(again)


def test_e2e_results_replot(tmp_path):
    row = {"tokens_per_s": 10.0, "speedup": 1.0}
    summary = {
        m: {c: dict(row) for c in ("rag", "qa", "overall")} for m in ("plain", "pld", "lookahead")
    }
    res = tmp_path / "e.json"
    res.write_text(json.dumps({"summary": summary, "records": []}))
    png = tmp_path / "e.png"
    assert plot.main([str(res), str(png)]) == 0 and _is_png(png)
    # With the nodes each lookahead policy verified per step: a third panel, its histogram.
    summary["lookahead"]["overall"]["nodes_per_step"] = {0: 40, 3: 12, 7: 30}
    summary["fixed 8/16/0.85"] = {c: dict(row) for c in ("rag", "qa", "overall")}
    summary["fixed 8/16/0.85"]["overall"]["nodes_per_step"] = {0: 50, 8: 45, 16: 5}
    res.write_text(json.dumps({"summary": summary, "records": []}))  # keys become strings
    assert plot.main([str(res), str(png)]) == 0 and _is_png(png)


def test_e2e_fixed_policies_parse():
    from benchmarks.e2e import FIXED_DEFAULT, fixed_policies

    assert fixed_policies(FIXED_DEFAULT) == [(8, 16, 0.85)]
    assert fixed_policies(" 4/8/0.5, 16/16/0 ,") == [(4, 8, 0.5), (16, 16, 0.0)]
    assert fixed_policies("") == []
    for bad in ("8/16", "8/4/0.1", "0/4/0.1", "a/b/c", "8/16/-1", "8/16/inf"):
        with pytest.raises(ValueError, match="--fixed"):
            fixed_policies(bad)


def test_plot_rejects_what_no_bench_wrote(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"hello": 1}))
    with pytest.raises(SystemExit, match="not a result of python -m benchmarks"):
        plot.main([str(bad), str(tmp_path / "x.png")])
    with pytest.raises(SystemExit, match="cannot read"):
        plot.main([str(tmp_path / "missing.json"), str(tmp_path / "x.png")])
