"""Configuration of the SGLang plugin: the one place that reads environment variables.

Two sources, no others:
- SGLang's own flags where they mean the same thing as ours (read from the resolved server
  arguments, never from `os.environ`): `--speculative-num-draft-tokens` N is the verify width
  (draft budget N - 1), `--speculative-ngram-max-trie-depth` the longest n-gram stored,
  `--speculative-ngram-capacity` the node bound, `--speculative-ngram-max-bfs-breadth` 1 for
  a single branch and > 1 for a multi-branch tree.
- `LOOKAHEAD_CONFIG`, a JSON object for the knobs SGLang has no flag for (`EXTRA_KEYS`).

`LOOKAHEAD_SGLANG_SKIP_VERSION_CHECK=1` lets the plugin load on an SGLang other than the
supported one (at the user's risk: the worker subclasses SGLang internals).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from lookahead import _core
from lookahead.args import RENAMED, renamed_note
from lookahead.errors import LookaheadConfigError
from lookahead.sglang.corpora import CorpusConfig
from lookahead.sglang.warm import WarmConfig
from lookahead.user_input import UserInputError, loads_json, quote

# The `--speculative-algorithm` value the plugin registers.
ALGORITHM_NAME = "LOOKAHEAD"

__all__ = [
    "ALGORITHM_NAME",
    "CONFIG_ENV",
    "EXTRA_KEYS",
    "NAMESPACE_MODES",
    "SKIP_VERSION_CHECK_ENV",
    "LookaheadConfigError",
    "PluginEnv",
    "ServingConfig",
    "read_env",
]

CONFIG_ENV = "LOOKAHEAD_CONFIG"
SKIP_VERSION_CHECK_ENV = "LOOKAHEAD_SGLANG_SKIP_VERSION_CHECK"

# How requests are grouped into tries: "shared" puts every request in one namespace,
# "extra_key" uses SGLang's per-request `extra_key` (which SGLang suffixes with the LoRA id),
# so tenants and adapters never draft from each other's outputs; "request" shares nothing.
NAMESPACE_MODES = ("shared", "extra_key", "request")
# The core's bounds (`Config::validate`), checked here so the launcher refuses a bad config
# before any scheduler process starts.
MAX_WEIGHT = _core.MAX_WEIGHT
MAX_CAPACITY_NODES = _core.MAX_CAPACITY_NODES
MIN_CAPACITY_BYTES = _core.MIN_CAPACITY_BYTES

# LOOKAHEAD_CONFIG keys and their defaults.
EXTRA_KEYS: dict[str, Any] = {
    "budget": None,  # drafted nodes per request; None -> N - 1 (the whole verify width)
    "own_weight": _core.DEFAULTS["own_weight"],
    "history_weight": _core.DEFAULTS["history_weight"],
    "keep_prompt_as_history": _core.DEFAULTS["keep_prompt_as_history"],
    "namespace": "extra_key",
    "exact_sampling": True,  # our exact tree sampling verification for non-greedy batches
    "index_threads": 0,  # background prompt-indexing threads (0: min(cores, 4); at most 256)
    "draft_threads": 0,  # draft_batch threads (0: half the cores, at most 8)
    # Context lengths [lo, hi] at which drafts leave the shared history out (null: never);
    # see LookaheadCache's history_skip.
    "history_skip": list(_core.DEFAULTS["history_skip"]),
    # Index prompts on background threads. None: yes with one model rank, no with tensor or
    # pipeline parallelism, where every rank drafts for itself and must draft the same tree:
    # background indexing can reach the node budget, and so evict, at timing-dependent moments.
    "background_indexing": None,
    # Seconds between the scheduler's `lookahead: cache stats {...}` log lines (0: none).
    "stats_interval_s": 60.0,
    # CPU only: at most this many rows (requests x verify width) in one verify forward; each
    # step verifies max(1, min(N, max_verify_rows // batch size)) nodes per request, the best
    # ones. None: each step's width is chosen by `lookahead.batch_sizing.BatchSizer` from what this
    # server's forwards cost and its drafts' scores (with several model ranks, which must
    # verify alike, DEFAULT_CPU_VERIFY_ROWS instead). CUDA verifies N always (its graphs and
    # overlap relay are built at width N), and refuses a value.
    "max_verify_rows": None,
    # Corpora (`lookahead.sglang.corpora`): a corpus draft's weight against the request's own
    # (`LookaheadCache`'s corpus_weight), and which requests a corpus serves ("all", "by_id").
    "corpus_weight": _core.DEFAULTS["corpus_weight"],
    "corpus_scope": "all",
    # A hard bound on the trie's bytes per scheduler (0: none; `LookaheadCache`'s
    # capacity_bytes: kept by the worst case, so a typical stream fills about a quarter).
    "capacity_bytes": 0,
    # Warm restarts (`lookahead.sglang.warm`): where to save the trie (at a clean shutdown,
    # and every save_interval_s seconds unless 0), and the file to start from.
    "save": None,
    "save_interval_s": 0,
    "load": None,
    "load_missing_ok": False,
}
# The fixed rule's rows where the sizer cannot be used (several model ranks). On a 2-core
# CPU a forward's cost grows about linearly in rows past a few dozen (fp32, SmolLM2-135M:
# 16 decode rows 236 ms, 128 verify rows 456 ms), so wide trees stop paying as the batch
# grows. Measured at 16 requests: 16, 32, 64 and 128 rows gave 75.9, 72.8, 79.3 and 63.5
# tok/s (no speculation 67.7); 64 keeps N = 8 up to 8 requests (BENCHMARKS.md §6.2).
DEFAULT_CPU_VERIFY_ROWS = 64
# The longest LOOKAHEAD_CONFIG read (ours are a few hundred characters), and the shortest
# stats interval (a log line per step would cost the step).
MAX_CONFIG_CHARS = 1 << 16
MIN_STATS_INTERVAL_S = 0.1


@dataclass(frozen=True)
class PluginEnv:
    """The environment variables the plugin reads, read once."""

    config_json: str | None
    skip_version_check: bool


def read_env(environ: Mapping[str, str] | None = None) -> PluginEnv:
    """Reads the plugin's environment variables (all of them, and nowhere else)."""
    env = os.environ if environ is None else environ
    skip = env.get(SKIP_VERSION_CHECK_ENV, "").strip().lower() in ("1", "true", "yes")
    raw = env.get(CONFIG_ENV)
    return PluginEnv(config_json=raw if raw and raw.strip() else None, skip_version_check=skip)


def _parse_extra(config_json: str | None) -> dict[str, Any]:
    if config_json is None:
        return {}
    if len(config_json) > MAX_CONFIG_CHARS:
        raise LookaheadConfigError(
            f"{CONFIG_ENV} has {len(config_json)} characters; at most {MAX_CONFIG_CHARS}"
        )
    try:  # no NaN, no huge integers, no deep nesting, no key given twice (`user_input`)
        extra = loads_json(config_json, CONFIG_ENV)
    except UserInputError as e:
        raise LookaheadConfigError(str(e)) from None
    if not isinstance(extra, dict):
        raise LookaheadConfigError(
            f"{CONFIG_ENV} must be a JSON object, got {type(extra).__name__}"
        )
    old = sorted(set(extra) & set(RENAMED))
    if old:
        raise LookaheadConfigError(f"{CONFIG_ENV}: {renamed_note(old[0])}")
    unknown = sorted(set(extra) - set(EXTRA_KEYS))
    if unknown:
        raise LookaheadConfigError(
            f"{CONFIG_ENV} has unknown keys {quote(unknown)}; known keys: {sorted(EXTRA_KEYS)}"
        )
    return extra


def _number(name: str, v: Any, lo: float, hi: float) -> float:
    # `not lo <= v <= hi` also refuses NaN (which `loads_json` refuses before this anyway).
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
        raise LookaheadConfigError(
            f"{CONFIG_ENV}: {name} must be a number in [{lo}, {hi:g}], got {quote(v)}"
        )
    return float(v)


def _int(name: str, v: Any, lo: int, hi: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        want = f"an int >= {lo}" if hi is None else f"an int in [{lo}, {hi}]"
        raise LookaheadConfigError(f"{CONFIG_ENV}: {name} must be {want}, got {quote(v)}")
    return v


def _bool(name: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise LookaheadConfigError(f"{CONFIG_ENV}: {name} must be true or false, got {quote(v)}")
    return v


def _interval(v: Any) -> float:
    """`stats_interval_s`: 0 (no stats lines) or [MIN_STATS_INTERVAL_S, 86400]."""
    s = _number("stats_interval_s", v, 0.0, 86400.0)
    if 0 < s < MIN_STATS_INTERVAL_S:
        raise LookaheadConfigError(
            f"{CONFIG_ENV}: stats_interval_s must be 0 (off) or at least "
            f"{MIN_STATS_INTERVAL_S} s, got {quote(v)}"
        )
    return s


def _capacity_bytes(v: Any) -> int:
    v = _int("capacity_bytes", v, 0)
    if 0 < v < MIN_CAPACITY_BYTES:
        raise LookaheadConfigError(
            f"{CONFIG_ENV}: capacity_bytes must be 0 (none) or at least {MIN_CAPACITY_BYTES} "
            f"(1 MiB), got {v}"
        )
    return v


def _skip(v: Any) -> tuple[int, int] | None:
    if v is None:
        return None
    if (
        not isinstance(v, (list, tuple))
        or len(v) != 2
        or not all(isinstance(x, int) and not isinstance(x, bool) for x in v)
        or not 1 <= v[0] <= v[1] <= 64
    ):
        raise LookaheadConfigError(
            f"{CONFIG_ENV}: history_skip must be null or [lo, hi] with 1 <= lo <= hi <= 64, "
            f"got {quote(v)}"
        )
    return (v[0], v[1])


@dataclass(frozen=True)
class ServingConfig:
    """Everything the worker needs, resolved from SGLang's arguments and `LOOKAHEAD_CONFIG`."""

    width: int  # verify width N (tokens per request per verify, root included)
    budget: int  # drafted nodes per request, <= N - 1
    max_depth: int
    capacity_nodes: int
    multi_branch: bool
    own_weight: float
    history_weight: float
    keep_prompt_as_history: bool
    namespace: str
    exact_sampling: bool
    index_threads: int
    draft_threads: int
    background_indexing: bool | None
    history_skip: tuple[int, int] | None
    stats_interval_s: float = 60.0
    max_verify_rows: int | None = None
    capacity_bytes: int = 0
    corpora: CorpusConfig = CorpusConfig()
    warm: WarmConfig = WarmConfig()
    model_ranks: int = 1  # TP x PP of the server (`for_ranks`)

    @property
    def sized_by_cost(self) -> bool:
        """Whether narrower CPU steps take their width from `lookahead.batch_sizing.BatchSizer`
        (`max_verify_rows` unset, one model rank) rather than `cpu_verify_width`."""
        return self.max_verify_rows is None and self.model_ranks == 1

    def cpu_verify_width(self, batch_size: int) -> int:
        """Nodes verified per request (root included) in a CPU decode step of `batch_size`
        requests by the fixed rule: N capped by `max_verify_rows` (DEFAULT_CPU_VERIFY_ROWS
        when unset; the worker keeps N wherever it does not narrow steps, CUDA included)."""
        cap = DEFAULT_CPU_VERIFY_ROWS if self.max_verify_rows is None else self.max_verify_rows
        return max(1, min(self.width, cap // max(1, batch_size)))

    @classmethod
    def from_args(cls, args: Any, config_json: str | None) -> ServingConfig:
        """Builds and checks the config from resolved server args (or any object with the
        `speculative_*` attributes) and the `LOOKAHEAD_CONFIG` JSON text."""
        extra = {**EXTRA_KEYS, **_parse_extra(config_json)}
        width = args.speculative_num_draft_tokens
        if isinstance(width, bool) or not isinstance(width, int) or width < 2:
            raise LookaheadConfigError(
                f"--speculative-num-draft-tokens must be an int >= 2 for LOOKAHEAD (the root "
                f"plus at least one drafted token), got {width!r}"
            )
        budget = extra["budget"]
        if budget is None:
            budget = width - 1
        budget = _int("budget", budget, 1)
        if budget > width - 1:
            raise LookaheadConfigError(
                f"{CONFIG_ENV}: budget={budget} does not fit the CUDA-graph verify width: "
                f"--speculative-num-draft-tokens={width} leaves room for {width - 1} drafted "
                f"tokens per request; raise --speculative-num-draft-tokens to {budget + 1} "
                "or lower the budget"
            )
        if budget > _core.MAX_BUDGET:
            raise LookaheadConfigError(
                f"budget {budget} exceeds the trie's maximum draft budget {_core.MAX_BUDGET}"
            )
        depth = args.speculative_ngram_max_trie_depth
        if isinstance(depth, bool) or not isinstance(depth, int) or not 2 <= depth <= 64:
            raise LookaheadConfigError(
                f"--speculative-ngram-max-trie-depth must be in [2, 64] for LOOKAHEAD, got {depth!r}"
            )
        capacity = args.speculative_ngram_capacity
        if (
            isinstance(capacity, bool)
            or not isinstance(capacity, int)
            or not 1 <= capacity <= MAX_CAPACITY_NODES
        ):
            raise LookaheadConfigError(
                f"--speculative-ngram-capacity must be an int in [1, {MAX_CAPACITY_NODES}], "
                f"got {capacity!r}"
            )
        breadth = args.speculative_ngram_max_bfs_breadth
        if isinstance(breadth, bool) or not isinstance(breadth, int) or breadth < 1:
            raise LookaheadConfigError(
                f"--speculative-ngram-max-bfs-breadth must be an int >= 1, got {breadth!r}"
            )
        namespace = extra["namespace"]
        if namespace not in NAMESPACE_MODES:
            raise LookaheadConfigError(
                f"{CONFIG_ENV}: namespace must be one of {list(NAMESPACE_MODES)}, got {quote(namespace)}"
            )
        own_weight = _number("own_weight", extra["own_weight"], 0.0, MAX_WEIGHT)
        history_weight = _number("history_weight", extra["history_weight"], 0.0, MAX_WEIGHT)
        if own_weight == history_weight == 0:
            raise LookaheadConfigError(
                f"{CONFIG_ENV}: own_weight and history_weight cannot both be 0"
            )
        if namespace == "request" and own_weight == 0:
            raise LookaheadConfigError(
                f"{CONFIG_ENV}: namespace 'request' drafts only from each request's own text, "
                "which own_weight 0 leaves out"
            )
        return cls(
            width=width,
            budget=budget,
            max_depth=depth,
            capacity_nodes=capacity,
            multi_branch=breadth > 1,
            own_weight=own_weight,
            history_weight=history_weight,
            keep_prompt_as_history=_bool("keep_prompt_as_history", extra["keep_prompt_as_history"]),
            namespace=namespace,
            exact_sampling=_bool("exact_sampling", extra["exact_sampling"]),
            index_threads=_int("index_threads", extra["index_threads"], 0, 256),
            draft_threads=_int("draft_threads", extra["draft_threads"], 0, 256),
            background_indexing=(
                None
                if extra["background_indexing"] is None
                else _bool("background_indexing", extra["background_indexing"])
            ),
            history_skip=_skip(extra["history_skip"]),
            stats_interval_s=_interval(extra["stats_interval_s"]),
            max_verify_rows=(
                None
                if extra["max_verify_rows"] is None
                else _int("max_verify_rows", extra["max_verify_rows"], 1, 1 << 20)
            ),
            capacity_bytes=_capacity_bytes(extra["capacity_bytes"]),
            corpora=CorpusConfig.from_args(
                args,
                extra,
                namespace,
                _number("corpus_weight", extra["corpus_weight"], 1e-6, MAX_WEIGHT),
                CONFIG_ENV,
            ),
            warm=WarmConfig.from_extra(extra, CONFIG_ENV),
        )

    @classmethod
    def for_server(cls, spec: Any, server_args: Any, config_json: str | None) -> ServingConfig:
        """The config of a server: `from_args` on its speculative arguments `spec`, and
        `for_ranks` its model ranks (`server_args`' TP x PP). The launcher and each
        scheduler's worker resolve it alike."""
        ranks = int(getattr(server_args, "tp_size", 1) or 1) * int(
            getattr(server_args, "pp_size", 1) or 1
        )
        return cls.from_args(spec, config_json).for_ranks(ranks)

    def for_ranks(self, ranks: int) -> ServingConfig:
        """This config for `ranks` model ranks (TP x PP), each drafting for itself: they
        must all draft alike, and background prompt builds may evict shared history at
        different moments on different ranks, so background indexing is on only with one
        rank when unset, and refused with several; and their forwards take different times,
        so CPU steps are sized by cost only with one rank (`sized_by_cost`)."""
        if self.background_indexing and ranks > 1:
            raise LookaheadConfigError(
                f"{CONFIG_ENV}: background_indexing true with {ranks} model ranks (TP x PP): "
                "ranks could draft different trees; leave it unset (off with several ranks) "
                "or set false"
            )
        background = ranks == 1 if self.background_indexing is None else self.background_indexing
        return dataclasses.replace(self, background_indexing=background, model_ranks=ranks)

    def as_dict(self) -> dict[str, Any]:
        """The config as a plain dict (for logs)."""
        return asdict(self)
