"""Per-request control: one request's `custom_params["lookahead"]`, checked and applied.

A request can switch drafting off, draft fewer nodes, or pin its namespace, through SGLang's
`custom_params` (its `/generate` `sampling_params`, and `extra_body` of the OpenAI
completions and chat endpoints):

    {"custom_params": {"lookahead": {"enabled": false}}}
    {"custom_params": {"lookahead": {"budget": 4, "namespace": "tenant-a"}}}

- `enabled` (bool, default true): false verifies the root alone at every step (the request
  decodes as without speculation; its text still feeds its namespace's history).
- `budget` (int in [0, N - 1]): at most this many drafted nodes per step (0 = `enabled: false`).
- `namespace` (a string of 1 to 128 characters): under namespace mode "extra_key", the
  namespace of requests whose `extra_key` is that string (their shared history and, under
  `corpus_scope` "by_id", their corpora), whatever this request's own `extra_key` and
  adapter (a client that can send an `extra_key` could join that namespace anyway); under
  the other modes it is checked and has no effect (the operator chose to share everything
  or nothing).

Other keys, values of another type or out of range fail that request alone with HTTP 400 and
one line saying what is wrong (`check_sampling_params`, run by SGLang's tokenizer manager as it
checks the other sampling parameters: patch `request_control`); the server keeps serving.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["KEY", "RequestControl", "check_sampling_params", "control_of", "parse_control"]

KEY = "lookahead"
MAX_NAMESPACE_CHARS = 128
_FIELDS = ("enabled", "budget", "namespace")


@dataclass(frozen=True)
class RequestControl:
    """What one request asked of LOOKAHEAD (the defaults: everything as configured)."""

    enabled: bool = True
    budget: int | None = None  # None: the server's
    namespace: str | None = None  # None: the server's namespace rule

    @property
    def drafts(self) -> bool:
        return self.enabled and self.budget != 0

    def limit(self, num_nodes: int) -> int:
        """The nodes (root included) this request verifies of a draft of `num_nodes`."""
        if not self.drafts:
            return 1
        return num_nodes if self.budget is None else min(num_nodes, self.budget + 1)


DEFAULT = RequestControl()


def parse_control(custom_params: Any, width: int) -> RequestControl:
    """`custom_params`' "lookahead" entry as a `RequestControl` (`DEFAULT` if absent);
    `width` is the server's verify width N. Raises `ValueError` naming the bad entry."""
    if not isinstance(custom_params, dict) or custom_params.get(KEY) is None:
        return DEFAULT
    raw = custom_params[KEY]
    where = f'custom_params["{KEY}"]'
    if not isinstance(raw, dict):
        raise ValueError(f"{where} must be an object, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(_FIELDS))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; known: {list(_FIELDS)}")
    enabled = raw.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ValueError(f"{where}.enabled must be true or false, got {enabled!r}")
    budget = raw.get("budget")
    if budget is not None and (
        isinstance(budget, bool) or not isinstance(budget, int) or not 0 <= budget < width
    ):
        raise ValueError(f"{where}.budget must be an int in [0, {width - 1}], got {budget!r}")
    namespace = raw.get("namespace")
    if namespace is not None and (
        not isinstance(namespace, str)
        or not 1 <= len(namespace) <= MAX_NAMESPACE_CHARS
        or not _utf8(namespace)
    ):
        raise ValueError(
            f"{where}.namespace must be a string of 1 to {MAX_NAMESPACE_CHARS} characters, "
            f"got {namespace!r}"
        )
    return RequestControl(enabled=enabled, budget=budget, namespace=namespace)


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")  # a lone surrogate (JSON allows one) is no namespace name
    except UnicodeEncodeError:
        return False
    return True


def control_of(req: Any, width: int) -> RequestControl:
    """The control of a scheduled SGLang `Req` (checked at intake; `DEFAULT` if its entry
    fails here anyway, so a request is never drafted from a value nobody checked)."""
    params = getattr(getattr(req, "sampling_params", None), "custom_params", None)
    if not params:
        return DEFAULT
    try:
        return parse_control(params, width)
    except ValueError:
        return RequestControl(enabled=False)


def check_sampling_params(sampling_params: Any) -> None:
    """The intake check of a LOOKAHEAD server (patch `request_control`, AROUND SGLang's
    `SamplingParams.verify`, whose `ValueError` becomes that request's HTTP 400)."""
    from sglang.srt.runtime_context import get_spec

    params = getattr(sampling_params, "custom_params", None)
    if params:
        parse_control(params, get_spec().speculative_num_draft_tokens)
