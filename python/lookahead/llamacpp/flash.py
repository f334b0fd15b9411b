"""Which of llama.cpp's flash-attention settings runs this engine's work sooner on this CPU:
`LlamaCppModel(flash_attn="fastest")`, the default.

Neither setting is right on every CPU (BENCHMARKS.md section 7.4): on a Xeon with AVX512, ggml's
flash-attention kernel makes each row of a verify forward cost nearly a full row at long
contexts, and off is faster; on an AVX512 EPYC, on decoded 1.05-1.14x faster than off in the
loop (research/llamacpp_flash_check.py). So at load the model times, in two one-sequence
contexts of the engine's own size (one per setting, on the same weights), a prompt of `PROMPT`
tokens and forwards of 1 and 4 rows after it, the two settings taking turns, and keeps the
setting whose workload (that prompt, then `STEPS` forwards, `WIDTH_SHARE` of each width) is
sooner, on unless off is `OFF_MARGIN` sooner. The contexts' size matters: with flash attention
off, llama.cpp keeps V transposed, rows as long as the context, and in a context of 517 tokens
the EPYC's one-row forwards timed on/off 0.98-1.00 on the Q4_0 file where the engine's
4096-token context gave 0.91-0.93 and plain decoding 0.88. About 2-7 s on the default model's
files (2 threads, EPYC, AVX512 or AVX2 kernels), at the first load of a GGUF file, and memory
for two more KV caches of the engine's size while it runs: the choice is kept on disk beside the
cost curves (`load_or_time`, keyed by the file, threads, CPU and llama.cpp build, as
`lookahead.llamacpp.costs.engine_key`), and `lookahead calibrate --engine llamacpp` times it
again; `--flash-attn off|on` skips it.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import numpy as np

from lookahead.costs import stderr_line

# The workload a setting is judged by: a prompt of PROMPT tokens, then STEPS forwards after it,
# of each width in WIDTHS (plain decoding's one row, a typical verify's 4) in its share of
# WIDTH_SHARE: the engine's steps on Spec-Bench verified the root alone 79-93 % of the time
# (research/llamacpp_flash_check.py). The shape of the demo's and the benchmark's requests:
# prompts of 300-700 tokens, 128 new tokens.
PROMPT = 512
STEPS = 128
WIDTHS = (1, 4)
WIDTH_SHARE = {1: 0.75, 4: 0.25}
SETTINGS = ("off", "on")
# Forwards of each width timed per setting (their median is kept).
REPS = 16
# Off only when its workload is this much sooner: ties and near-ties go to llama.cpp's own
# default for the CPU (on). On this EPYC on decoded 1.05-1.14x faster in every in-loop check
# while the Q4_1 timing's on/off spread over 0.90-1.02 from run to run (eleven timings on
# 2026-12-06/07); on the Xeon off won by far more (one row 1.58x dearer with on).
OFF_MARGIN = 0.03
# Bump when the timing or its file changes meaning: a choice kept in another format is timed
# again. (2: contexts of the engine's size, widths weighed by WIDTH_SHARE; 3: OFF_MARGIN.)
FLASH_FORMAT = 3
# The longest choice file read (ours are about 1 KB).
MAX_FILE_BYTES = 1 << 16


@dataclass(frozen=True)
class FlashChoice:
    """What `fastest` measured: seconds of the prompt and of a forward of each width, by
    setting, and the setting it chose."""

    choice: str
    prompt_tokens: int
    prompt_s: dict  # setting -> seconds of the prompt's forwards
    forward_s: dict  # setting -> {width: seconds of one forward of that many rows}
    probe_s: float = 0.0  # seconds the timing took, its contexts made and freed included
    kept: str | None = None  # the file it was read from (timed at an earlier load), or None

    def workload_s(self, setting: str) -> float:
        """Seconds of the workload (`STEPS` forwards after the prompt) in `setting`."""
        return workload_s(self.prompt_s[setting], self.forward_s[setting])

    def describe(self) -> str:
        """`flash attention on, chosen by timing at load: a 512-token prompt and 128 forwards
        of 1 and 4 rows 2.53 s off, 2.34 s on (prompt 1.14 / 1.06 s; forwards 7.2, 21.7 /
        6.8, 19.7 ms); timed in 2.6 s`."""
        widths = " and ".join(str(w) for w in self.forward_s[SETTINGS[0]])
        totals = ", ".join(f"{self.workload_s(s):.2f} s {s}" for s in SETTINGS)
        prompts = " / ".join(f"{self.prompt_s[s]:.2f}" for s in SETTINGS)
        rows = " / ".join(
            ", ".join(f"{1e3 * t:.1f}" for t in self.forward_s[s].values()) for s in SETTINGS
        )
        return (
            f"flash attention {self.choice}, chosen by timing at load: a "
            f"{self.prompt_tokens}-token prompt and {STEPS} forwards of {widths} rows {totals} "
            f"(prompt {prompts} s; forwards {rows} ms); timed in {self.probe_s:.1f} s"
            + (f" at an earlier load, kept in {self.kept}" if self.kept else "")
        )


def workload_s(prompt_s: float, forward_s: dict) -> float:
    """Seconds of the prompt and then `STEPS` forwards of the widths in `forward_s` ({width:
    seconds of one forward}) in their shares of `WIDTH_SHARE` (among the widths timed)."""
    share = sum(WIDTH_SHARE[w] for w in forward_s)
    return prompt_s + STEPS * sum(WIDTH_SHARE[w] * t for w, t in forward_s.items()) / share


def pick(seconds: dict) -> str:
    """ "off" where its workload's `seconds` are at least `OFF_MARGIN` fewer than on's, else
    "on" (llama.cpp's own default on the CPU)."""
    return "off" if seconds["off"] <= (1.0 - OFF_MARGIN) * seconds["on"] else "on"


def shape(n_ctx: int, n_batch: int) -> tuple[int, tuple]:
    """(prompt tokens, widths) of the timing in a context of `n_ctx` tokens whose forwards
    take `n_batch` rows at most."""
    widths = tuple(w for w in WIDTHS if w <= n_batch)
    return max(1, min(PROMPT, n_ctx - max(widths) - 1)), widths


def fastest(model, n_ctx: int, n_batch: int, threads: int, reps: int = REPS) -> FlashChoice:
    """Times the workload in two one-sequence contexts of `n_ctx` tokens on `model`'s weights
    (`sibling`), one per setting, freed before it returns: the prompt (as long as `n_ctx`
    allows, up to `PROMPT` tokens) a graph (`n_ubatch` tokens) at a time, then `reps` forwards
    of each width after it, the settings alternating at every graph and forward, in an order
    that turns each time, so that the VM's drift hits both alike."""
    n_prompt, widths = shape(n_ctx, n_batch)
    width = max(widths)
    t_start = time.perf_counter()
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, model.n_vocab, size=n_prompt).tolist()
    prompt_s: dict = {s: 0.0 for s in SETTINGS}
    forward_s: dict = {s: {w: [] for w in widths} for s in SETTINGS}
    ctxs: dict = {}
    turn = 0

    def forward(tokens, start: int, keep: bool) -> dict:
        """Seconds of one forward of `tokens` from position `start`, logits for the last row
        or (`keep` False: a step, dropped after) for every row, in each context."""
        nonlocal turn
        n = len(tokens)
        want = [not keep or i == n - 1 for i in range(n)]
        out = {}
        for s in SETTINGS if turn % 2 == 0 else SETTINGS[::-1]:
            m = ctxs[s]
            t0 = time.perf_counter()
            m.decode(tokens, range(start, start + n), [[0]] * n, want)
            out[s] = time.perf_counter() - t0
            if not keep:
                m.seq_rm(-1, start, -1)
        turn += 1
        return out

    try:
        for s in SETTINGS:
            ctxs[s] = model.sibling(n_ctx, 1, n_batch, threads, s)
        # Warm-up: the first forward of a context builds its graphs (and the first of all
        # pages the weights in), which a request's forwards do not pay.
        forward(prompt[:width], 0, keep=False)
        step = ctxs[SETTINGS[0]].n_ubatch
        for i in range(0, n_prompt, step):
            for s, t in forward(prompt[i : i + step], i, keep=True).items():
                prompt_s[s] += t
        for _ in range(reps):
            for w in widths:
                toks = rng.integers(0, model.n_vocab, size=w).tolist()
                for s, t in forward(toks, n_prompt, keep=False).items():
                    forward_s[s][w].append(t)
    finally:
        for m in ctxs.values():
            m.close()
    med = {s: {w: float(np.median(v)) for w, v in d.items()} for s, d in forward_s.items()}
    choice = pick({s: workload_s(prompt_s[s], med[s]) for s in SETTINGS})
    return FlashChoice(choice, n_prompt, prompt_s, med, time.perf_counter() - t_start)


def choice_key(model, n_ctx: int, n_batch: int, threads: int) -> dict:
    """What a choice depends on: `lookahead.llamacpp.costs.engine_key` and the timing's
    shape."""
    from lookahead.llamacpp.costs import engine_key

    n_prompt, widths = shape(n_ctx, n_batch)
    return {**engine_key(model, threads), "timing": "flash attention", "prompt": n_prompt,
            "widths": list(widths), "format": FLASH_FORMAT}  # fmt: skip


def _seconds(v) -> float:
    """`v` as a positive finite number of seconds, else ValueError."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf:
        raise ValueError(f"not a time in seconds: {v!r}")
    return float(v)


def from_json(d, key: dict, path) -> FlashChoice:
    """The choice a file holds for `key`, or ValueError: another key, a malformed file, or a
    choice its own times do not give."""
    if not isinstance(d, dict) or d.get("key") != key:
        raise ValueError("kept for another file, machine or build")
    widths = key["widths"]
    prompt_s = {s: _seconds(d["prompt_s"][s]) for s in SETTINGS}
    forward_s = {s: {w: _seconds(d["forward_s"][s][str(w)]) for w in widths} for s in SETTINGS}
    if any(len(d["forward_s"][s]) != len(widths) for s in SETTINGS):
        raise ValueError("other widths")
    choice = pick({s: workload_s(prompt_s[s], forward_s[s]) for s in SETTINGS})
    if d.get("choice") != choice or d.get("prompt_tokens") != key["prompt"]:
        raise ValueError(f"its choice {d.get('choice')!r} is not what its times give")
    probe = d.get("probe_s", 0.0)
    probe = _seconds(probe) if probe else 0.0
    return FlashChoice(choice, key["prompt"], prompt_s, forward_s, probe, str(path))


def load_or_time(model, n_ctx: int, n_batch: int, threads: int, retime: bool = False,
                 progress=stderr_line) -> FlashChoice:  # fmt: skip
    """The choice kept on disk for this GGUF file, threads, CPU and llama.cpp build
    (`choice_key`), else (or with `retime`) one timed now (`fastest`) and kept for later
    loads. A file that cannot be read or written, or holds a choice its own times do not
    give, costs a timing (said in one line; a damaged file, `UserInputError`, is a
    ValueError), never the load."""
    from lookahead.costs import cost_path, keep_json
    from lookahead.user_input import read_json_file

    key = choice_key(model, n_ctx, n_batch, threads)
    path = cost_path(key, "flash-")
    if not retime:
        try:
            return from_json(
                read_json_file(path, MAX_FILE_BYTES, "flash-attention file"), key, path
            )
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            if progress:
                progress(f"lookahead: timing flash attention again ({path} unusable: {e})")
    got = fastest(model, n_ctx, n_batch, threads)
    keep_json({"key": key, **dataclasses.asdict(got)}, path)
    return got
