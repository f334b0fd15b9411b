"""What a LOOKAHEAD scheduler reports: a log line, and Prometheus series with `--enable-metrics`.

- Every `stats_interval_s` seconds of decoding, one `lookahead: cache stats {...}` log line
  (the trie's `stats()`, the verify widths used, the CPU sizer's state).
- With SGLang's `--enable-metrics`, `/metrics` carries these series beside SGLang's own
  (SGLang runs prometheus_client in multiprocess mode: each scheduler writes its samples to
  `PROMETHEUS_MULTIPROC_DIR` and the HTTP server merges them). Labels: `tp_rank`,
  `pp_rank`, `dp_rank` (a bounded set; nothing is labelled by namespace, whose count has no
  bound). Every rank keeps its own trie and counts its own steps: TP ranks count the same
  steps, so read the step counters of one `tp_rank`.

  | series | type | what |
  |---|---|---|
  | `lookahead_verify_steps_total` | counter | decode steps verified |
  | `lookahead_request_steps_total` | counter | requests verified, one per request per step |
  | `lookahead_verify_rows_total` | counter | rows those forwards verified (width x requests) |
  | `lookahead_draft_nodes_total` | counter | drafted nodes verified (roots and padding not counted) |
  | `lookahead_accepted_tokens_total` | counter | drafted tokens accepted |
  | `lookahead_emitted_tokens_total` | counter | tokens the verify steps emitted (accepted + one each) |
  | `lookahead_cut_nodes_total` | counter | drafted nodes cut before the verify by requests' budgets, switches and grammars |
  | `lookahead_evicted_nodes_total` | counter | trie nodes evicted |
  | `lookahead_truncated_prompts_total` | counter | prompts indexed only in part (a request's share of the capacity) |
  | `lookahead_trie_nodes`, `_history_nodes`, `_own_nodes`, `_corpus_nodes` | gauge | nodes stored: all, shared histories, live requests' own tries, corpora |
  | `lookahead_trie_capacity_nodes`, `lookahead_trie_bytes` | gauge | the node bound; bytes held (`stats()["bytes"]`) |
  | `lookahead_namespaces`, `lookahead_live_requests`, `lookahead_corpora` | gauge | counts |

  Counters move every decode step, but `evicted_nodes` and `truncated_prompts`, which move
  with the gauges: at most once a second, while decoding (`stats()` walks the namespaces).
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from typing import Any

__all__ = ["GAUGES", "Observer"]

logger = logging.getLogger(__name__)

PREFIX = "lookahead_"
GAUGE_EVERY_S = 1.0
# counter -> help
COUNTERS = {
    "verify_steps": "Decode steps verified by LOOKAHEAD",
    "request_steps": "Requests verified, one per request per step",
    "verify_rows": "Rows the verify forwards computed (width x requests)",
    "draft_nodes": "Drafted nodes verified (roots and padding not counted)",
    "accepted_tokens": "Drafted tokens accepted",
    "emitted_tokens": "Tokens the verify steps emitted (accepted + one per request)",
    "cut_nodes": "Drafted nodes cut before the verify by requests' budgets, switches, grammars",
    "evicted_nodes": "Trie nodes evicted",
    "truncated_prompts": "Prompts indexed only in part (a request's share of the capacity)",
}
# gauge -> (stats() key, help)
GAUGES = {
    "trie_nodes": ("nodes", "Trie nodes stored, all tries together"),
    "history_nodes": ("history_nodes", "Nodes in the namespaces' shared histories"),
    "own_nodes": ("own_nodes", "Nodes in live requests' own tries"),
    "corpus_nodes": ("corpus_nodes", "Nodes in corpora"),
    "trie_capacity_nodes": ("capacity_nodes", "The trie's node bound"),
    "trie_bytes": ("bytes", "Bytes the trie holds"),
    "namespaces": ("namespaces", "Namespaces with history or live requests"),
    "live_requests": ("live_requests", "Requests the trie is tracking"),
    "corpora": ("corpora", "Corpora served"),
}
_FROM_STATS = {"evicted_nodes": "evicted_nodes", "truncated_prompts": "truncated_prompts"}


def _ranks() -> dict[str, str]:
    """This scheduler's ranks (each rank keeps its own trie and counts its own steps: sum
    the series of one `tp_rank` for the server's steps)."""
    out = {}
    try:
        from sglang.srt.runtime_context import get_parallel

        par = get_parallel()
    except Exception:  # outside a scheduler (tests): one process, rank 0
        par = None
    for name in ("tp_rank", "pp_rank", "dp_rank"):
        try:
            out[name] = str(getattr(par, name) or 0)
        except Exception:  # a rank this SGLang does not publish here
            out[name] = "0"
    return out


# One set of series per process and labels: prometheus_client refuses a second
# registration of a name (a worker built again in the same process reuses them).
_SERIES: dict[tuple, _Series] = {}


class _Series:
    """The Prometheus series of one scheduler (prometheus_client imported here, in the
    scheduler process, after SGLang set `PROMETHEUS_MULTIPROC_DIR`)."""

    def __init__(self, labels: dict[str, str]) -> None:
        from prometheus_client import Counter as PromCounter
        from prometheus_client import Gauge

        names = list(labels)
        self.counters = {
            k: PromCounter(PREFIX + k, h, names).labels(**labels) for k, h in COUNTERS.items()
        }
        self.gauges = {
            k: Gauge(PREFIX + k, h, names, multiprocess_mode="mostrecent").labels(**labels)
            for k, (_, h) in GAUGES.items()
        }


class Observer:
    """A worker's reporting: `step` after each verify, `tick` before each decode step."""

    def __init__(self, stats_interval_s: float, enable_metrics: bool | None = None) -> None:
        self.interval = stats_interval_s
        self.widths: Counter = Counter()  # verify width -> decode steps
        self._log_due = time.monotonic() + stats_interval_s
        self._gauge_due = 0.0
        self._seen = dict.fromkeys(_FROM_STATS, 0)
        if enable_metrics is None:
            enable_metrics = _metrics_enabled()
        self.series = _series(_ranks()) if enable_metrics else None

    def step(self, width: int, bs: int, drafted: int, emitted: int | None, cut: int) -> None:
        """One decode verify: `bs` requests at `width` rows each, `drafted` real nodes
        verified besides the roots, `emitted` tokens out (None: not read back, no series),
        `cut` nodes cut before it."""
        self.widths[width] += 1
        if self.series is None or emitted is None:
            return
        c = self.series.counters
        c["verify_steps"].inc()
        c["request_steps"].inc(bs)
        c["verify_rows"].inc(width * bs)
        c["draft_nodes"].inc(drafted)
        c["accepted_tokens"].inc(max(emitted - bs, 0))
        c["emitted_tokens"].inc(emitted)
        if cut:
            c["cut_nodes"].inc(cut)

    def tick(self, drafter: Any, sizer: Any = None, context: int = 0) -> None:
        """Before a decode step: the log line and the gauges, when they are due."""
        now = time.monotonic()
        log = self.interval > 0 and now >= self._log_due
        gauges = self.series is not None and now >= self._gauge_due
        if not (log or gauges):
            return
        stats = drafter.stats()
        if gauges:
            self._gauge_due = now + GAUGE_EVERY_S
            self.export(stats)
        if log:
            self._log_due = now + self.interval
            line = {**stats, "verify_widths": dict(self.widths)}
            if sizer is not None:
                line["sizer"] = sizer.describe(context)
            logger.info("lookahead: cache stats %s", json.dumps(line, sort_keys=True))

    def export(self, stats: dict) -> None:
        """Sets the gauges from a cache `stats()`, and moves the counters it keeps."""
        for name, (key, _) in GAUGES.items():
            self.series.gauges[name].set(stats.get(key, 0))
        for name, key in _FROM_STATS.items():
            now = int(stats.get(key, 0))
            # A cache reset (SGLang's flush_cache) starts its counts again from 0.
            delta = now - self._seen[name] if now >= self._seen[name] else now
            if delta:
                self.series.counters[name].inc(delta)
            self._seen[name] = now


def _series(labels: dict[str, str]) -> _Series:
    key = tuple(sorted(labels.items()))
    if key not in _SERIES:
        _SERIES[key] = _Series(labels)
    return _SERIES[key]


def _metrics_enabled() -> bool:
    try:
        from sglang.srt.runtime_context import get_observability

        return bool(get_observability().enable_metrics)
    except Exception:  # outside a scheduler process
        return False
