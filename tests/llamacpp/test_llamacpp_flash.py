"""`lookahead.llamacpp.flash.fastest` on a stand-in model whose forwards advance a clock by
a cost set per flash-attention setting: the choice follows the costs, the settings take
turns, and every context it opens is closed, also when one fails to open. (The real probe on
a real GGUF: tests/llamacpp/test_llamacpp_engine.py.)"""

from __future__ import annotations

import pytest
from lookahead.llamacpp import flash


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class StandIn:
    """A model whose `sibling` contexts cost `per_row[setting]` seconds a row of a forward
    (prompt rows at a tenth of that) and record what ran, in order."""

    def __init__(self, clock, per_row: dict, fail_on: str | None = None, n_ubatch: int = 128):
        self.clock, self.per_row, self.fail_on = clock, per_row, fail_on
        self.n_vocab, self.n_ubatch = 50, n_ubatch
        self.log: list = []
        self.opened: list = []

    def sibling(self, n_ctx, n_seq_max, n_batch, threads, flash_attn):
        if flash_attn == self.fail_on:
            raise RuntimeError("no context")
        ctx = Context(self, flash_attn, n_ctx, n_batch)
        self.opened.append(ctx)
        return ctx


class Context:
    def __init__(self, model, setting, n_ctx, n_batch):
        self.model, self.setting, self.n_ctx, self.n_batch = model, setting, n_ctx, n_batch
        self.n_ubatch = min(model.n_ubatch, n_batch)
        self.closed = 0
        self.cells = 0

    def decode(self, tokens, positions, seqs, want):
        assert not self.closed and 0 < len(tokens) <= self.n_batch
        assert list(positions)[0] == self.cells and self.cells + len(tokens) <= self.n_ctx
        self.cells += len(tokens)
        per_row = self.model.per_row[self.setting] * (1.0 if all(want) else 0.1)
        self.model.clock.now += per_row * len(tokens)
        self.model.log.append((self.setting, len(tokens)))

    def seq_rm(self, seq, p0, p1):
        self.cells = p0

    def close(self):
        self.closed += 1


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(flash.time, "perf_counter", c)
    return c


def test_the_choice_follows_the_measured_costs_and_the_settings_take_turns(clock):
    m = StandIn(clock, {"off": 1.0e-3, "on": 0.8e-3})
    c = flash.fastest(m, n_ctx=8192, n_batch=512, threads=2)
    assert c.choice == "on" and c.prompt_tokens == flash.PROMPT
    assert c.forward_s["on"] == {1: pytest.approx(0.8e-3), 4: pytest.approx(3.2e-3)}
    assert c.prompt_s["off"] == pytest.approx(flash.PROMPT * 1.0e-4)
    assert c.workload_s("on") < c.workload_s("off")
    # what the timing took: every forward it ran, in both settings (contexts cost nothing here)
    spent = sum(m.per_row[s] * n * (1.0 if n <= 4 else 0.1) for s, n in m.log)
    assert c.probe_s == pytest.approx(spent) and f"timed in {spent:.1f} s" in c.describe()
    # every forward ran in both settings, back to back, the first of each pair turning
    assert len(m.log) % 2 == 0
    pairs = [(m.log[i], m.log[i + 1]) for i in range(0, len(m.log), 2)]
    assert all(a[1] == b[1] and {a[0], b[0]} == {"off", "on"} for a, b in pairs)
    firsts = [a[0] for a, _ in pairs]
    assert firsts == ["off", "on"] * (len(firsts) // 2) + ["off"] * (len(firsts) % 2)
    assert [ctx.closed for ctx in m.opened] == [1, 1]
    # on unless off is OFF_MARGIN sooner: on at a tie and a near-tie, off when clearly cheaper
    for per_row, want in ((1.0e-3, "on"), (1.02e-3, "on"), (1.05e-3, "off"), (1.5e-3, "off")):
        other = StandIn(clock, {"off": 1.0e-3, "on": per_row})
        assert flash.fastest(other, 8192, 512, 2).choice == want, per_row
    # the contexts have the engine's size (llama.cpp's cost with flash off depends on it)
    assert [ctx.n_ctx for ctx in m.opened] == [8192, 8192]


def test_a_short_context_or_batch_shrinks_the_probe_to_fit():
    m = StandIn(Clock(), {"off": 1.0, "on": 1.0}, n_ubatch=2)
    c = flash.fastest(m, n_ctx=40, n_batch=3, threads=1)
    assert c.prompt_tokens == 40 - 1 - 1 and set(c.forward_s["off"]) == {1}  # widths <= 3: 1
    assert all(n <= 3 for _, n in m.log)


def test_every_context_opened_is_closed_when_one_fails_to_open(clock):
    m = StandIn(clock, {"off": 1.0e-3, "on": 1.0e-3}, fail_on="on")
    with pytest.raises(RuntimeError, match="no context"):
        flash.fastest(m, 8192, 512, 2)
    assert [ctx.setting for ctx in m.opened] == ["off"] and m.opened[0].closed == 1


@pytest.fixture
def keyed(monkeypatch, tmp_path):
    """A stand-in's key: its threads and the timing's shape (the real one reads the GGUF
    file and the llama.cpp build), kept in a folder of this test."""
    monkeypatch.setenv("LOOKAHEAD_COST_DIR", str(tmp_path))

    def key(model, n_ctx, n_batch, threads):
        n_prompt, widths = flash.shape(n_ctx, n_batch)
        return {"model": "stand-in.gguf", "threads": threads, "prompt": n_prompt,
                "widths": list(widths), "format": flash.FLASH_FORMAT}  # fmt: skip

    monkeypatch.setattr(flash, "choice_key", key)
    return tmp_path


def test_a_choice_is_kept_for_later_loads_and_timed_again_when_asked(clock, keyed):
    m = StandIn(clock, {"off": 1.0e-3, "on": 0.8e-3})
    lines: list = []
    first = flash.load_or_time(m, 8192, 512, 2, progress=lines.append)
    assert first.choice == "on" and first.kept is None and len(m.opened) == 2
    (path,) = keyed.glob("flash-*.json")
    # a later load reads it: nothing timed, the same numbers, and it says where from
    again = flash.load_or_time(m, 8192, 512, 2, progress=lines.append)
    assert len(m.opened) == 2 and again.kept == str(path) and lines == []
    assert (again.choice, again.prompt_s, again.forward_s) == (
        first.choice, first.prompt_s, first.forward_s)  # fmt: skip
    assert f"at an earlier load, kept in {path}" in again.describe()
    # asked to time again, or another key (threads, shape): timed, kept beside
    m.per_row["on"] = 1.2e-3
    assert flash.load_or_time(m, 8192, 512, 2, retime=True).choice == "off"
    assert len(m.opened) == 4 and flash.load_or_time(m, 8192, 512, 2).choice == "off"
    flash.load_or_time(m, 8192, 512, 1)
    flash.load_or_time(m, 300, 512, 2)
    assert len(m.opened) == 8 and len(list(keyed.glob("flash-*.json"))) == 3


def test_a_damaged_or_inconsistent_choice_file_is_timed_again(clock, keyed):
    import json

    m = StandIn(clock, {"off": 1.0e-3, "on": 0.8e-3})
    flash.load_or_time(m, 8192, 512, 2)
    (path,) = keyed.glob("flash-*.json")
    good = json.loads(path.read_text())
    for bad in ("{", "[]", json.dumps({**good, "choice": "off"}),  # not what its times give
                json.dumps({**good, "prompt_s": {"off": -1.0, "on": 1.0}}),
                json.dumps({**good, "forward_s": {"off": {"1": 1.0}, "on": {"1": 1.0}}}),
                "x" * (flash.MAX_FILE_BYTES + 1)):  # fmt: skip
        path.write_text(bad)
        lines: list = []
        opened = len(m.opened)
        c = flash.load_or_time(m, 8192, 512, 2, progress=lines.append)
        assert c.kept is None and c.choice == "on" and len(m.opened) == opened + 2
        assert len(lines) == 1 and "timing flash attention again" in lines[0], bad[:40]
        assert json.loads(path.read_text())["choice"] == "on"  # written whole again
    # a folder that cannot be written costs the file, not the load
    path.unlink()
    path.mkdir()
    assert flash.load_or_time(m, 8192, 512, 2, progress=None).choice == "on"
