"""Warm restarts: a server's trie saved to a file and loaded by the next start.

`LOOKAHEAD_CONFIG` keys:
- `save` (a path): the scheduler saves its cache there (`LookaheadCache.save`: checksummed,
  atomic) on a clean shutdown (SIGTERM or SIGINT to the server: SGLang drains the requests,
  then asks each scheduler to exit, which saves first) and every `save_interval_s` seconds of
  serving (0: at shutdown only), on a thread of its own: drafts go on while it writes.
- `load` (a path, often the same): the scheduler starts from that file. Refused at start-up
  with one line when the file is damaged (any damaged byte is caught), was saved by another
  tokenizer or vocabulary, or with other trie settings (depth, capacity, weights, history
  skip, corpus weight). A missing file is refused too unless `load_missing_ok` (a first
  deploy), which starts cold with a warning; a damaged or mismatched file is never skipped
  silently: delete it to start cold.

A restart keeps every namespace's shared history (outputs, and prompts merged with
`keep_prompt_as_history`) and the corpora; it loses the live requests' own tries (their
requests are gone), recycled predictions, the stats counters and what the sizer learnt of the
forwards' cost (it learns again in the first steps). With several model ranks every rank
loads the file and only the first rank saves (all ranks hold the same trie); several data-
parallel replicas each hold their own trie, so `save` is refused there.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lookahead.cache import LookaheadCache
from lookahead.errors import LookaheadConfigError, LookaheadError

__all__ = ["META_FORMAT", "Saver", "WarmConfig", "fingerprint", "load_cache", "warm_start"]

logger = logging.getLogger(__name__)

# What a LOOKAHEAD server writes as the save file's `meta`.
META_FORMAT = "lookahead-sglang-1"
# The trie settings a loaded file must share with the server.
MATCHED = (
    "max_depth",
    "capacity_nodes",
    "own_weight",
    "history_weight",
    "keep_prompt_as_history",
    "history_skip",
    "corpus_weight",
    "capacity_bytes",
)


@dataclass(frozen=True)
class WarmConfig:
    save: str | None = None
    save_interval_s: float = 0.0
    load: str | None = None
    load_missing_ok: bool = False

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any], env: str) -> WarmConfig:
        paths = {}
        for key in ("save", "load"):
            v = extra[key]
            if v is not None and (not isinstance(v, str) or not v.strip() or "\0" in v):
                raise LookaheadConfigError(
                    f"{env}: {key} must be null or a file path, got {json.dumps(v)}"
                )
            paths[key] = v
        interval = extra["save_interval_s"]
        if (
            isinstance(interval, bool)
            or not isinstance(interval, (int, float))
            or not (interval == 0 or 1 <= interval <= 86400 * 7)
        ):
            raise LookaheadConfigError(
                f"{env}: save_interval_s must be 0 (at shutdown only) or 1 to 604800 seconds, "
                f"got {json.dumps(interval)}"
            )
        if interval and paths["save"] is None:
            raise LookaheadConfigError(f"{env}: save_interval_s needs save (a path)")
        missing_ok = extra["load_missing_ok"]
        if not isinstance(missing_ok, bool):
            raise LookaheadConfigError(f"{env}: load_missing_ok must be true or false")
        return cls(paths["save"], float(interval), paths["load"], missing_ok)

    def check_paths(self, env: str, data_parallel: int) -> None:
        """The launcher's checks, before any scheduler starts."""
        if self.save is not None:
            if data_parallel > 1:
                raise LookaheadConfigError(
                    f"{env}: save with {data_parallel} data-parallel replicas: each holds its "
                    "own trie and they would overwrite one file"
                )
            folder = Path(self.save).parent
            if not folder.is_dir() or not os.access(folder, os.W_OK):
                raise LookaheadConfigError(
                    f"{env}: save: folder {str(folder)!r} does not exist or is not writable"
                )
        if self.load is not None and not self.load_missing_ok and not Path(self.load).exists():
            raise LookaheadConfigError(
                f"{env}: load: {self.load} does not exist (set load_missing_ok to start cold "
                "when it is missing)"
            )


def fingerprint(tokenizer: Any, vocab_size: int | None) -> dict[str, Any]:
    """What identifies the token ids a trie holds: the tokenizer's vocabulary (a digest of
    every token and its id) and the model's vocabulary size."""
    digest = None
    if tokenizer is not None and hasattr(tokenizer, "get_vocab"):
        items = sorted(tokenizer.get_vocab().items(), key=lambda kv: (kv[1], kv[0]))
        digest = hashlib.sha256(json.dumps(items, ensure_ascii=False).encode()).hexdigest()
    return {"format": META_FORMAT, "vocab_size": vocab_size, "vocab_sha256": digest}


def _mismatch(path: str, meta: str | None, expect: dict[str, Any]) -> str | None:
    try:
        saved = json.loads(meta) if meta else None
    except json.JSONDecodeError:
        saved = None
    if not isinstance(saved, dict) or saved.get("format") != META_FORMAT:
        return f"{path} was not saved by a LOOKAHEAD server"
    for key in ("vocab_size", "vocab_sha256"):
        if saved.get(key) != expect.get(key):
            return (
                f"{path} was saved with another tokenizer or vocabulary ({key} "
                f"{saved.get(key)!r}, this server's {expect.get(key)!r}): its token ids "
                "mean other tokens here"
            )
    return None


def load_cache(
    path: str, missing_ok: bool, fresh: LookaheadCache, expect_meta: dict[str, Any]
) -> LookaheadCache | None:
    """The cache saved at `path`, checked against the server's `fresh` cache's settings and
    tokenizer; None (a warning) if it is missing and `missing_ok`. Raises
    `LookaheadConfigError`, one line, for every other problem."""
    env = "LOOKAHEAD_CONFIG load"
    if missing_ok and not Path(path).exists():
        logger.warning("lookahead: %s: %s does not exist; starting cold", env, path)
        return None
    want = fresh.config
    started = time.monotonic()
    try:
        cache = LookaheadCache.load(
            path,
            background_indexing=want["background_indexing"],
            index_threads=want["index_threads"],
        )
    except (LookaheadError, OSError) as e:
        raise LookaheadConfigError(f"{env}: {e}") from None
    why = _mismatch(path, cache.saved_meta, expect_meta)
    got = cache.config
    diff = [
        f"{k}={got[k]!r} (this server: {want[k]!r})"
        for k in MATCHED
        if (tuple(got[k]) if isinstance(got[k], list) else got[k])
        != (tuple(want[k]) if isinstance(want[k], list) else want[k])
    ]
    if why is None and diff:
        why = f"{path} was saved with other trie settings: " + ", ".join(diff)
    if why is not None:
        raise LookaheadConfigError(f"{env}: {why}; start with the same settings, or without load")
    s = cache.stats()
    logger.info(
        "lookahead: warm start from %s in %.2f s: %d history nodes in %d namespaces, %d "
        "corpora (%d nodes)",
        path,
        time.monotonic() - started,
        s["history_nodes"],
        s["namespaces"],
        s["corpora"],
        s["corpus_nodes"],
    )
    return cache


class Saver:
    """Saves a cache to `path` every `interval_s` seconds (on its own thread) and at exit."""

    def __init__(self, path: str, interval_s: float, meta: dict[str, Any]) -> None:
        self.path = path
        self.interval_s = interval_s
        self.meta = json.dumps(meta, sort_keys=True)
        self._due = time.monotonic() + interval_s
        self._thread: threading.Thread | None = None
        self.saves = 0
        self.failures = 0

    def tick(self, cache: LookaheadCache) -> None:
        """From the serving loop: starts a background save when one is due."""
        if not self.interval_s or time.monotonic() < self._due:
            return
        if self._thread is not None and self._thread.is_alive():
            return
        self._due = time.monotonic() + self.interval_s
        self._thread = threading.Thread(
            target=self.save, args=(cache, "interval"), name="lookahead-save", daemon=True
        )
        self._thread.start()

    def save(self, cache: LookaheadCache, why: str) -> bool:
        """Saves now (waiting for a background save first); a failure is logged, not raised:
        serving goes on, the previous file stays whole."""
        t = self._thread
        if t is not None and t.is_alive() and t is not threading.current_thread():
            t.join()
        started = time.monotonic()
        try:
            cache.save(self.path, meta=self.meta)
        except (LookaheadError, OSError) as e:
            self.failures += 1
            logger.error("lookahead: save (%s) to %s failed: %s", why, self.path, e)
            return False
        self.saves += 1
        logger.info(
            "lookahead: saved the trie (%s) to %s in %.2f s: %d bytes",
            why,
            self.path,
            time.monotonic() - started,
            os.path.getsize(self.path),
        )
        return True


def warm_start(warm: WarmConfig, drafter: Any, target_worker: Any, tokenizer: Any) -> Saver | None:
    """A scheduler's start: its drafter's cache replaced by the `load` file's, if any; its
    saver if it saves (the first model rank only)."""
    runner = getattr(target_worker, "model_runner", None)
    vocab = getattr(getattr(runner, "model_config", None), "vocab_size", None)
    meta = fingerprint(tokenizer, vocab)
    if warm.load is not None:
        cache = load_cache(warm.load, warm.load_missing_ok, drafter.cache, meta)
        if cache is not None:
            drafter.cache = cache
    first_rank = not getattr(target_worker, "tp_rank", 0) and not getattr(
        target_worker, "pp_rank", 0
    )
    if warm.save is None or not first_rank:
        return None
    return Saver(warm.save, warm.save_interval_s, meta)
