"""Where the output ends: EOS and stop tokens, stop strings (searched incrementally in the
decoded text), and `max_new_tokens`; and the text deltas streamed to `on_tokens`."""

from __future__ import annotations

from collections.abc import Sequence


class TextTracker:
    """Incremental decoding of the generated ids: text deltas and stop-string search."""

    def __init__(
        self,
        tokenizer,
        stop_strings: Sequence[str],
        prompt_ids: Sequence[int] = (),
        skip_special_tokens: bool = True,
    ):
        self.tok = tokenizer
        self.skip_special = skip_special_tokens
        self.stop = list(stop_strings)  # `generate` refuses empty ones
        self.max_stop = max((len(s) for s in self.stop), default=0)
        self.emitted_text = ""
        # A stop string may begin in the prompt (HF's StopStringCriteria reads the whole
        # sequence): the prompt's last tokens (each decodes to >= 1 character, or nothing)
        # lead the text searched.
        self.lead = list(prompt_ids[-self.max_stop - 8 :]) if self.stop else []

    def decode(self, ids: list) -> str:
        """The text stop strings are searched in: special tokens included, as in HF."""
        return self.tok.decode(ids, skip_special_tokens=False) if ids else ""

    def text(self, ids: list) -> str:
        """The text the caller sees (special tokens dropped unless asked to keep them)."""
        return self.tok.decode(ids, skip_special_tokens=self.skip_special) if ids else ""

    def _ends_a_stop(self, text: str, prev: int) -> bool:
        """Whether a stop string occurs in `text` ending after its first `prev` characters."""
        return any(text.find(s, max(0, prev - len(s) + 1)) != -1 for s in self.stop)

    def stop_cut(self, ids: list, start: int) -> int | None:
        """Smallest k > start such that a stop string ends within the text ids[start:k] add
        (after the prompt and ids[:start]), or None."""
        if not self.stop:
            return None
        lead = self.lead
        prev = len(self.decode(lead + ids[:start]))
        if not self._ends_a_stop(self.decode(lead + ids), prev):
            return None
        for k in range(start + 1, len(ids) + 1):
            if self._ends_a_stop(self.decode(lead + ids[:k]), prev):
                return k
        return len(ids)

    def delta(self, ids: list, final: bool) -> str:
        """The text `ids` add since the last call (held back while a character is incomplete)."""
        text = self.text(ids)
        # An incomplete UTF-8 sequence decodes to U+FFFD; wait for the rest unless finished.
        if not final and text.endswith("\ufffd"):
            return ""
        if not text.startswith(self.emitted_text):
            new = text[len(self.emitted_text) :] if len(text) > len(self.emitted_text) else ""
        else:
            new = text[len(self.emitted_text) :]
        self.emitted_text = text
        return new


def find_cut(out: list, start: int, eos: set, stop_ids: set, text, max_new: int):
    """`(cut, reason)` once the output ends within `out[start:]` (the tokens this step added):
    keep `out[:cut]`; `(None, None)` to go on. The first EOS or stop token ends it after that
    token, unless a stop string completed before it; nothing runs past `max_new`."""
    cut = reason = None
    for k in range(start, len(out)):
        tok = out[k]
        if tok in eos or tok in stop_ids:
            cut, reason = k + 1, ("eos" if tok in eos else "stop_token")
            break
    if text is not None:
        # A stop string completed before that token ends the output first.
        k = text.stop_cut(out if cut is None else out[: cut - 1], start)
        if k is not None:
            cut, reason = k, "stop_string"
    if cut is None and len(out) >= max_new:
        cut, reason = max_new, "length"
    elif cut is not None and cut > max_new:
        cut, reason = max_new, "length"
    return cut, reason
