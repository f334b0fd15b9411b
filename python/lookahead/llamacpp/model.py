"""A GGUF model loaded by llama.cpp (through llama-cpp-python's C API), and one forward.

`LlamaCppModel` owns a llama.cpp model and context with a unified KV cache of `n_seq_max`
sequences: the verified context is in every sequence, and a draft tree's branches are
sequences of their own for the length of one forward (`lookahead.llamacpp.tree`). `decode`
runs one `llama_decode` over any tokens, positions and sequence sets, and returns the logits
of every token it was asked for.
"""

from __future__ import annotations

import copy
import ctypes
import os
from pathlib import Path

import numpy as np

from lookahead.errors import InvalidInput, ModelLoadError
from lookahead.llamacpp.library import llama_cpp, load_params, logits_address, quiet

# A GGUF file starts with these bytes (then a little-endian version).
GGUF_MAGIC = b"GGUF"
# Sequences of the KV cache: one per branch of the widest tree a step verifies, at most.
DEFAULT_SEQS = 33
# Tokens one `llama_decode` takes at most (a prompt is fed in chunks of this many).
DEFAULT_BATCH = 512
# Tokens llama.cpp computes in one graph (it splits a longer batch): a prompt's attention
# without flash attention builds a [ubatch, cached] score matrix per head, and smaller ones
# stay in the caches. Measured (`llama-bench -fa 0 -b 2048 -ub 32,64,128,192,512 -p 768`,
# Q4_1 default model, 2 threads, Xeon): 263, 282, 276, 273, 255 tok/s.
DEFAULT_UBATCH = 128
# Arrays over llama.cpp's logits kept at most (`LlamaCppModel._logits`), then made again.
MAX_VIEWS = 64
# llama.cpp's flash attention, by the name llama-server's `--flash-attn` takes; "fastest" is
# ours: whichever of off and on runs `lookahead.llamacpp.flash`'s workload sooner here.
FLASH_ATTN = {"fastest": None, "off": 0, "on": 1, "auto": -1}
# Measured at load because neither setting is right on every CPU: on a Xeon with AVX512, ggml's
# flash-attention kernel walks the cached keys once per query row, so a verify forward's extra
# rows cost nearly a full row each at long contexts (`llama-bench -fa 0,1 -d 768`, Q4_1 default
# model, 2 threads: one row 13.7 ms off against 21.6 ms on, 8 rows 3.1x one row off against
# 4.5x on; a 512-token prompt 5 % slower off); on an AVX512 EPYC plain llama.cpp decodes 4-8 %
# faster with it on. BENCHMARKS.md section 7.4.
DEFAULT_FLASH_ATTN = "fastest"


def check_gguf(path: str | os.PathLike) -> Path:
    """`path` as an existing regular file that starts like a GGUF file, else ModelLoadError."""
    p = Path(path)
    if not p.is_file():
        raise ModelLoadError(f"GGUF file not found (or not a regular file): {p}")
    try:
        with open(p, "rb") as f:
            head = f.read(8)
    except OSError as e:
        raise ModelLoadError(f"cannot read {p}: {e}") from e
    if len(head) < 8 or head[:4] != GGUF_MAGIC:
        raise ModelLoadError(f"{p} is not a GGUF file (it does not start with b'GGUF')")
    return p


def default_threads() -> int:
    """The CPUs this process may run on: llama.cpp's own default (4 threads) on a 2-core
    machine runs plain decoding of the default model at a quarter of the speed of 2
    threads (measured: 40 against 155 tok/s), each thread waiting for a core."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):  # no affinity API on this platform
        return max(os.cpu_count() or 1, 1)


class LlamaCppModel:
    """A GGUF model and one llama.cpp context for one request at a time.

    `n_ctx`: the context in tokens (default: the model's training context, at most 8192);
    `n_threads`: CPU threads (default: the CPUs this process may run on, `default_threads`);
    `n_seq_max`: KV sequences, so the widest tree verified has at most `n_seq_max` branches;
    `flash_attn`: llama.cpp's flash attention, "fastest" (default, `DEFAULT_FLASH_ATTN`: off
    or on, whichever `lookahead.llamacpp.flash.fastest` measures faster here, about 2.5 s at
    a GGUF file's first load on the default model, kept for later loads, `retime` times it
    again: `flash.load_or_time`; `flash_choice` says what was measured), "off", "on" or
    "auto" (llama.cpp's: on where the backend has it); then the setting the context has."""

    def __init__(
        self,
        path: str | os.PathLike,
        n_ctx: int | None = None,
        n_threads: int | None = None,
        n_seq_max: int = DEFAULT_SEQS,
        n_batch: int = DEFAULT_BATCH,
        verbose: bool = False,
        flash_attn: str = DEFAULT_FLASH_ATTN,
        retime: bool = False,
    ):
        if not isinstance(flash_attn, str) or flash_attn not in FLASH_ATTN:
            names = ", ".join(FLASH_ATTN)
            raise ValueError(f"flash_attn must be one of {names}, got {flash_attn!r}")
        ll = llama_cpp()
        self.ll = ll
        self.path = check_gguf(path)
        if not 1 <= n_seq_max <= 256:
            raise ValueError(f"n_seq_max must be in [1, 256], got {n_seq_max}")
        if not verbose:
            quiet(ll)
        ll.llama_backend_init()
        mp = load_params(ll)
        self.model = ll.llama_model_load_from_file(str(self.path).encode(), mp)
        if not self.model:
            raise ModelLoadError(f"llama.cpp could not load {self.path} (damaged or unsupported)")
        self.vocab = ll.llama_model_get_vocab(self.model)
        self.n_vocab = int(ll.llama_vocab_n_tokens(self.vocab))
        # A model without a tokenizer (ids in, ids out) has no text to show.
        self.has_text = int(ll.llama_vocab_type(self.vocab)) != ll.LLAMA_VOCAB_TYPE_NONE
        train_ctx = int(ll.llama_model_n_ctx_train(self.model))
        n_ctx = int(n_ctx) if n_ctx else min(train_ctx, 8192)
        threads = int(n_threads) if n_threads else default_threads()
        self.ctx = self._batch = None
        self._views: dict = {}  # (logits address, rows) -> array over it (`_logits`)
        self._logits_at = logits_address(ll)
        self.flash_choice = None
        if flash_attn == "fastest":
            from lookahead.llamacpp.flash import load_or_time

            try:
                self.flash_choice = load_or_time(self, n_ctx, int(n_batch), threads, retime)
            except Exception:
                self.close()
                raise
            flash_attn = self.flash_choice.choice
        self._open_context(n_ctx, n_seq_max, n_batch, threads, flash_attn)

    def _open_context(
        self, n_ctx: int, n_seq_max: int, n_batch: int, threads: int, flash_attn: str
    ) -> None:
        """Opens this model's context (it has none yet): a unified KV cache of `n_seq_max`
        sequences, `n_batch` tokens a forward, prompts computed in graphs of `DEFAULT_UBATCH`
        tokens, flash attention `flash_attn` ("off", "on" or "auto")."""
        if FLASH_ATTN.get(flash_attn) is None:  # "fastest" is chosen before a context opens
            raise ValueError(f"a context's flash_attn is off, on or auto, got {flash_attn!r}")
        ll = self.ll
        cp = ll.llama_context_default_params()
        cp.n_ctx = int(n_ctx)
        cp.n_batch = int(n_batch)
        cp.n_ubatch = min(int(n_batch), DEFAULT_UBATCH)
        cp.n_seq_max = int(n_seq_max)
        cp.kv_unified = True  # a tree's branches share the context's cells
        cp.n_threads = cp.n_threads_batch = int(threads)
        cp.flash_attn_type = FLASH_ATTN[flash_attn]
        self.ctx = ll.llama_init_from_model(self.model, cp)
        if not self.ctx:
            self.close()
            raise ModelLoadError(f"llama.cpp could not make a context for {self.path}")
        self.n_ctx = int(ll.llama_n_ctx(self.ctx))
        self.n_seq_max = int(n_seq_max)
        self.n_batch = int(n_batch)
        self.n_ubatch = int(cp.n_ubatch)
        self.mem = ll.llama_get_memory(self.ctx)
        self._batch = ll.llama_batch_init(self.n_batch, 0, self.n_seq_max)
        self.threads = int(cp.n_threads)
        self.flash_attn = flash_attn

    def sibling(
        self, n_ctx: int, n_seq_max: int, n_batch: int, threads: int, flash_attn: str
    ) -> LlamaCppModel:
        """Another context on this model's weights, loaded once (`_open_context`'s arguments):
        closing it frees only its context, and it must be closed before this model is."""
        other = copy.copy(self)
        other.ctx = other._batch = None
        other._owns_model = False
        other._views = {}  # arrays over this context's own buffer (`_logits`)
        other.flash_choice = None
        other._open_context(n_ctx, n_seq_max, n_batch, threads, flash_attn)
        return other

    def cost_source(self) -> tuple:
        """(key, measure) of this context's cost curve (`lookahead.costs.timing_of`)."""
        from lookahead.llamacpp.costs import cost_key, measure_costs

        return cost_key(self), measure_costs

    def close(self) -> None:
        """Frees the context and the model, or only the context of a `sibling` (also at
        garbage collection)."""
        ll = getattr(self, "ll", None)
        if ll is None:
            return
        if getattr(self, "_batch", None) is not None:
            ll.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "ctx", None):
            ll.llama_free(self.ctx)
            self.ctx = None
        if getattr(self, "model", None) and getattr(self, "_owns_model", True):
            ll.llama_model_free(self.model)
        self.model = None

    def __del__(self):
        try:
            self.close()
        except TypeError:  # at interpreter exit llama_cpp's functions may be gone already
            pass

    # --- text ---------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        if not self.has_text:
            raise ValueError(f"{self.path.name} has no tokenizer: give the prompt as token ids")
        data = text.encode("utf-8")
        n_max = len(data) + 16
        buf = (self.ll.llama_token * n_max)()
        n = self.ll.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, True)
        if n < 0:  # the buffer was short: -n is the count
            n_max = -n
            buf = (self.ll.llama_token * n_max)()
            n = self.ll.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, True)
        return list(buf[:n])

    def piece(self, token: int, special: bool = True) -> bytes:
        """The bytes of one token (special tokens rendered as text, or as nothing)."""
        buf = ctypes.create_string_buffer(64)
        n = self.ll.llama_token_to_piece(self.vocab, int(token), buf, 64, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self.ll.llama_token_to_piece(self.vocab, int(token), buf, -n, 0, special)
        return buf.raw[:n]

    def detokenize(self, tokens, special: bool = True) -> str:
        """The text of `tokens` ("" for a model without a tokenizer); `special`: special
        tokens as their text (else left out)."""
        if not self.has_text:
            return ""
        raw = b"".join(self.piece(t, special) for t in tokens)
        return raw.decode("utf-8", errors="replace")

    @property
    def chat_template(self) -> str | None:
        """The GGUF's chat template (`tokenizer.chat_template`, Jinja), or None."""
        raw = self.ll.llama_model_chat_template(self.model, None)
        return raw.decode("utf-8", errors="replace") if raw else None

    def encode(self, prompt, chat: bool = False) -> list[int]:
        """Prompt ids: ids checked as the HF engine checks them (ints in the vocabulary), or
        non-empty, valid text tokenized with the model's tokenizer;
        `chat`: as one user turn in the GGUF's chat template (rendered with Jinja as HF
        `apply_chat_template` renders it; then tokenized without an added BOS, as HF does),
        or ValueError `NO_CHAT_TEMPLATE` if it has none."""
        from lookahead.hf.inputs import NO_CHAT_TEMPLATE, text_problem, token_ids

        if not isinstance(prompt, str):
            return token_ids(prompt, self.n_vocab)  # the HF engine's checks of ids
        if not prompt:
            raise ValueError("the prompt is empty")
        problem = text_problem(prompt)
        if problem:
            raise InvalidInput(f"the prompt {problem}")
        if not chat:
            return self.tokenize(prompt)

        tmpl = self.chat_template if self.has_text else None
        if not tmpl:
            raise ValueError(NO_CHAT_TEMPLATE)
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        text = env.from_string(tmpl).render(
            messages=[{"role": "user", "content": prompt}],
            add_generation_prompt=True,
            bos_token=self.detokenize([self.ll.llama_vocab_bos(self.vocab)]),
            eos_token=self.detokenize([self.ll.llama_vocab_eos(self.vocab)]),
        )
        return self.tokenize(text, add_special=False)

    def is_eog(self, token: int) -> bool:
        return bool(self.ll.llama_vocab_is_eog(self.vocab, int(token)))

    # --- forwards -----------------------------------------------------------------------

    def reset(self) -> None:
        """Empties the KV cache (a new request)."""
        self.ll.llama_memory_clear(self.mem, True)

    def decode(self, tokens, positions, seqs, want, copy: bool = True) -> np.ndarray:
        """One `llama_decode` of `tokens` at `positions`, token i in the sequences `seqs[i]`;
        returns the logits [sum(want), V] of the tokens where `want[i]`: a copy, or with
        `copy=False` a view of llama.cpp's buffer, valid until the next forward (a step
        that reads its rows at once saves copying 200 KB a row)."""
        n = len(tokens)
        if not 0 < n <= self.n_batch:
            raise ValueError(f"a forward takes 1 to {self.n_batch} tokens, got {n}")
        b = self._batch
        b.n_tokens = n
        for i in range(n):
            b.token[i] = int(tokens[i])
            b.pos[i] = int(positions[i])
            s = seqs[i]
            b.n_seq_id[i] = len(s)
            row = b.seq_id[i]
            for j, x in enumerate(s):
                row[j] = int(x)
            b.logits[i] = 1 if want[i] else 0
        rc = self.ll.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed ({rc}) on {n} tokens")
        rows = int(sum(1 for w in want if w))
        return self._logits(rows, copy)

    def _logits(self, rows: int, copy: bool = True) -> np.ndarray:
        """The last forward's `rows` rows of logits, copied or not, through an array made
        once per (buffer address, rows): making one cost 30-60 us a step right after a
        forward (measured). A moved buffer has a new address, and `rows` never exceeds the
        last forward's outputs, so a kept array never reads past its buffer."""
        if rows == 0:  # a prompt chunk before the last
            return np.empty((rows, self.n_vocab), dtype=np.float32)
        addr = self._logits_at(self.ctx)
        view = self._views.get((addr, rows))
        if view is None:
            if len(self._views) >= MAX_VIEWS:
                self._views.clear()
            kind = ctypes.c_float * (rows * self.n_vocab)
            view = np.frombuffer(kind.from_address(addr), dtype=np.float32)
            view = self._views[(addr, rows)] = view.reshape(rows, self.n_vocab)
        return view.copy() if copy else view

    def prefill(self, tokens: list[int], seqs) -> np.ndarray:
        """Feeds `tokens` from position 0 in chunks, each in every sequence of `seqs`;
        returns the last token's logits [V]."""
        if not tokens:
            raise ValueError("the prompt must hold at least one token")
        last = None
        for s in range(0, len(tokens), self.n_batch):
            chunk = tokens[s : s + self.n_batch]
            want = [False] * len(chunk)
            end = s + len(chunk) == len(tokens)
            if end:
                want[-1] = True
            out = self.decode(chunk, range(s, s + len(chunk)), [seqs] * len(chunk), want)
            if end:
                last = out[0]
        return last

    def seq_rm(self, seq: int, p0: int, p1: int) -> None:
        self.ll.llama_memory_seq_rm(self.mem, seq, p0, p1)

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        self.ll.llama_memory_seq_cp(self.mem, src, dst, p0, p1)
