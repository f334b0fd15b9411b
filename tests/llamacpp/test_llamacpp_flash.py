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
    # off is kept unless on is MARGIN sooner; then off when it is the cheaper
    near = StandIn(clock, {"off": 1.0e-3, "on": 1.0e-3 * (1 - flash.MARGIN / 2)})
    assert flash.fastest(near, 8192, 512, 2).choice == "off"
    dear = StandIn(clock, {"off": 1.0e-3, "on": 1.5e-3})
    assert flash.fastest(dear, 8192, 512, 2).choice == "off"


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
