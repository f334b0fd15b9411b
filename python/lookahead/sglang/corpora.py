"""NGRAM's external corpora, served by LOOKAHEAD's trie.

The interface is NGRAM's, so an operator's files, flags and endpoints carry over:
- at start-up, `--speculative-ngram-external-corpus-path FILE` (JSONL, one JSON string per
  document) up to `--speculative-ngram-external-corpus-max-tokens` tokens, tokenized by
  SGLang's own reader with the model's tokenizer (its errors, word for word), under the file's
  path as corpus id;
- while serving, `POST /add_external_corpus` (`corpus_id`, and `file_path` or `documents`),
  `POST /remove_external_corpus` (`corpus_id`) and `GET /list_external_corpora`: SGLang's
  tokenizer manager tokenizes, and its scheduler calls the worker's `add_external_corpus` on a
  background thread (decoding goes on), then `commit_corpus_load`; `CorpusBook` holds what
  those calls do.

Each corpus becomes one `LookaheadCache` corpus (`add_corpus`: never evicted, at most half of
the capacity for all corpora together, cut and said so past that; docs/interfaces.md,
"Corpora"), drafted beside each request's own text and history at `corpus_weight`.
Which requests a corpus serves (`LOOKAHEAD_CONFIG` `corpus_scope`): "all" (NGRAM's rule: every
request), or "by_id" (tenants apart: a corpus added as `EXTRA_KEY/NAME` serves only requests
whose `extra_key` is EXTRA_KEY, and an id without "/" is refused; the start-up file, the
operator's, serves every request). `--speculative-ngram-external-sam-budget` is NGRAM's (the
nodes its tree reserves for the corpus); LOOKAHEAD ranks corpus paths with the rest instead.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lookahead.errors import LookaheadConfigError

__all__ = [
    "CORPUS_SCOPES",
    "SEPARATOR_TOKEN",
    "CorpusBook",
    "CorpusConfig",
    "check_corpus_file",
    "documents_of",
    "jsonl_documents",
    "serve_add",
    "serve_list",
    "serve_remove",
]

logger = logging.getLogger(__name__)

# SGLang's document separator in `token_chunks` (sglang.srt.speculative.cpp_ngram.
# external_corpus.SEPARATOR_TOKEN): the chunks of one document follow one another, and a
# document after the first starts with it.
SEPARATOR_TOKEN = -(2**31)
CORPUS_SCOPES = ("all", "by_id")


@dataclass(frozen=True)
class CorpusConfig:
    """The corpus settings of a server."""

    path: str | None = None  # the start-up corpus file
    max_tokens: int = 10_000_000  # NGRAM's --speculative-ngram-external-corpus-max-tokens
    weight: float = 1.0  # LOOKAHEAD_CONFIG corpus_weight
    scope: str = "all"  # LOOKAHEAD_CONFIG corpus_scope

    @classmethod
    def from_args(
        cls,
        spec: Any,
        extra: Mapping[str, Any],
        namespace_mode: str,
        weight: float,
        config_env: str,
    ) -> CorpusConfig:
        """From SGLang's corpus flags on `spec`, `LOOKAHEAD_CONFIG`'s `corpus_scope` in
        `extra`, and the checked `corpus_weight`."""
        path = getattr(spec, "speculative_ngram_external_corpus_path", None)
        max_tokens = getattr(spec, "speculative_ngram_external_corpus_max_tokens", 10_000_000)
        if path is not None and (
            isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens <= 0
        ):
            raise LookaheadConfigError(
                "--speculative-ngram-external-corpus-max-tokens must be positive when "
                "--speculative-ngram-external-corpus-path is set."
            )
        scope = extra["corpus_scope"]
        if scope not in CORPUS_SCOPES:
            raise LookaheadConfigError(
                f"{config_env}: corpus_scope must be one of {list(CORPUS_SCOPES)}, got "
                f"{json.dumps(scope)}"
            )
        if scope == "by_id" and namespace_mode != "extra_key":
            raise LookaheadConfigError(
                f"{config_env}: corpus_scope 'by_id' keeps tenants' corpora apart by "
                f"extra_key, which namespace {json.dumps(namespace_mode)} does not (use "
                "namespace 'extra_key')"
            )
        return cls(path=path, max_tokens=max_tokens, weight=weight, scope=scope)

    def scope_key(self, corpus_id: str) -> str | None:
        """The extra_key whose requests a corpus added under `corpus_id` serves (None:
        every request)."""
        if self.scope == "all" or corpus_id == self.path:
            return None
        key, sep, name = corpus_id.partition("/")
        if not sep or not key or not name:
            raise ValueError(
                f"corpus id {corpus_id!r}: under corpus_scope 'by_id' a corpus id names the "
                "extra_key it serves, as EXTRA_KEY/NAME"
            )
        return key


def jsonl_documents(path: str | Path):
    """(line number, document) of a corpus file in NGRAM's format, one JSON string per
    non-blank line; a bad line raises `LookaheadConfigError` in SGLang's reader's words."""
    with Path(path).open("r", encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise LookaheadConfigError(
                    f"Invalid JSON in external ngram corpus at line {line_no}: {e.msg}"
                ) from None
            if not isinstance(record, str):
                raise LookaheadConfigError(
                    f"Invalid external ngram corpus record at line {line_no}: expected a "
                    "JSON string."
                )
            yield line_no, record


def check_corpus_file(path: str) -> None:
    """The launcher's check of a start-up corpus file, before any scheduler starts: it
    exists and every non-blank line is a JSON string (SGLang's reader's own messages; the
    token limit needs the tokenizer and is checked where the corpus is loaded)."""
    if not Path(path).is_file():
        raise LookaheadConfigError(f"External ngram corpus path does not exist: {path}")
    try:
        for _ in jsonl_documents(path):
            pass
    except (OSError, UnicodeDecodeError) as e:
        raise LookaheadConfigError(f"cannot read external ngram corpus {path}: {e}") from None


def documents_of(token_chunks: list[list[int]]) -> list[list[int]]:
    """SGLang's `token_chunks` as whole documents: chunks joined, split at the separator."""
    docs: list[list[int]] = [[]]
    for chunk in token_chunks:
        for t in chunk:
            if t == SEPARATOR_TOKEN:
                docs.append([])
            else:
                docs[-1].append(t)
    return [d for d in docs if d]


class CorpusBook:
    """The worker's side of SGLang's corpus calls, over its drafter's cache."""

    def __init__(self, drafter: Any, config: CorpusConfig) -> None:
        self.drafter = drafter
        self.config = config
        self._notes: dict[str, str] = {}

    def add(self, corpus_id: str, token_chunks: list[list[int]]) -> int:
        """Builds and publishes corpus `corpus_id` (SGLang's background thread); returns the
        tokens it holds. Raises ValueError with a line for the client on bad input."""
        key = self.config.scope_key(corpus_id)
        scope = None if key is None else self.drafter.namespace_of_key(key)
        docs = documents_of(token_chunks)
        given = sum(len(d) for d in docs)
        cache = self.drafter.cache
        info = cache.add_corpus(corpus_id, docs, namespace=scope)
        if self.drafter.cache is not cache:  # the cache was reset meanwhile: keep it
            cache.move_corpora_to(self.drafter.cache)
        where = "every request" if scope is None else f"namespace {scope!r}"
        if info["cut"]:
            note = (
                f" (cut at {info['tokens']} of {given} tokens: corpora hold at most half of "
                f"--speculative-ngram-capacity, {info['nodes']} trie nodes here; raise it "
                "or remove a corpus)"
            )
            self._notes[corpus_id] = note
            logger.warning("lookahead: corpus %r%s", corpus_id, note)
        logger.info(
            "lookahead: corpus %r loaded: %d tokens, %d trie nodes, %d bytes, serving %s",
            corpus_id,
            info["tokens"],
            info["nodes"],
            info["bytes"],
            where,
        )
        return int(info["tokens"])

    def note(self, corpus_id: str) -> str | None:
        """What the reply to adding `corpus_id` should add (a cut), once."""
        return self._notes.pop(corpus_id, None)

    def remove(self, corpus_id: str) -> None:
        if not self.drafter.cache.remove_corpus(corpus_id):
            raise ValueError(f"no corpus {corpus_id!r} is loaded")
        logger.info("lookahead: corpus %r removed", corpus_id)

    def listing(self) -> dict[str, int]:
        """Corpus id -> tokens, as `/list_external_corpora` reports them."""
        return {c["id"]: int(c["tokens"]) for c in self.drafter.cache.corpora()}

    def load_start_up(self, tokenizer: Any) -> None:
        """The `--speculative-ngram-external-corpus-path` file, read by SGLang's own reader
        (NGRAM's format, limits and errors), unless a warm start brought it back."""
        path = self.config.path
        if path is None:
            return
        if any(c["id"] == path for c in self.drafter.cache.corpora()):
            logger.info("lookahead: corpus %r restored from the save file", path)
            return
        from sglang.srt.speculative.cpp_ngram.external_corpus import (
            iter_external_corpus_chunks,
        )

        try:
            chunks = list(iter_external_corpus_chunks(path, tokenizer, self.config.max_tokens))
        except ValueError as e:
            raise LookaheadConfigError(str(e)) from None
        self.add(path, chunks)


# -- the HTTP endpoints, in SGLang's tokenizer manager (patch `corpus_endpoints`) ----------


async def serve_add(manager: Any, obj: Any) -> Any:
    """`/add_external_corpus` for LOOKAHEAD: the documents (or the JSONL file at
    `file_path`, read by SGLang's reader) tokenized as NGRAM tokenizes them, sent to every
    scheduler, their replies merged."""
    from sglang.srt.managers.communicator import FanOutCommunicator
    from sglang.srt.managers.io_struct import AddExternalCorpusReqOutput
    from sglang.srt.runtime_context import get_spec
    from sglang.srt.speculative.cpp_ngram.external_corpus import iter_external_corpus_chunks

    manager.auto_create_handle_loop()
    max_tokens = get_spec().speculative_ngram_external_corpus_max_tokens
    truncated = False
    try:
        if not obj.corpus_id:
            import uuid

            obj.corpus_id = uuid.uuid4().hex
        if obj.file_path is not None:
            obj.token_chunks = list(
                iter_external_corpus_chunks(obj.file_path, manager.tokenizer, max_tokens)
            )
        elif obj.documents is not None:
            chunks, total = [], 0
            for doc in obj.documents:
                ids = list(manager.tokenizer.encode(doc, add_special_tokens=False)) if doc else []
                if not ids:
                    continue
                if chunks:
                    ids = [SEPARATOR_TOKEN, *ids]
                if total + len(ids) > max_tokens:
                    truncated = True
                    break
                chunks.append(ids)
                total += len(ids)
            obj.token_chunks = chunks
        else:
            return AddExternalCorpusReqOutput(
                success=False, message="Either file_path or documents must be provided."
            )
        obj.file_path = obj.documents = None
        results = await manager.add_external_corpus_communicator(obj)
        ok, message = FanOutCommunicator.merge_results(results)
        if truncated and ok:
            message += f" (truncated: exceeded {max_tokens} token limit)"
        return AddExternalCorpusReqOutput(
            success=ok,
            corpus_id=results[0].corpus_id if ok else "",
            message=message,
            loaded_token_count=results[0].loaded_token_count if ok else 0,
        )
    except Exception as e:  # a bad file, a bad document: this request fails, alone
        return AddExternalCorpusReqOutput(success=False, message=str(e))


async def serve_remove(manager: Any, corpus_id: str) -> Any:
    """`/remove_external_corpus` for LOOKAHEAD."""
    from sglang.srt.managers.communicator import FanOutCommunicator
    from sglang.srt.managers.io_struct import (
        RemoveExternalCorpusReqInput,
        RemoveExternalCorpusReqOutput,
    )

    manager.auto_create_handle_loop()
    results = await manager.remove_external_corpus_communicator(
        RemoveExternalCorpusReqInput(corpus_id=corpus_id)
    )
    ok, message = FanOutCommunicator.merge_results(results)
    return RemoveExternalCorpusReqOutput(success=ok, message=message)


async def serve_list(manager: Any) -> Any:
    """`/list_external_corpora` for LOOKAHEAD."""
    from sglang.srt.managers.communicator import FanOutCommunicator
    from sglang.srt.managers.io_struct import (
        ListExternalCorporaReqInput,
        ListExternalCorporaReqOutput,
    )

    manager.auto_create_handle_loop()
    results = await manager.list_external_corpora_communicator(ListExternalCorporaReqInput())
    ok, message = FanOutCommunicator.merge_results(results)
    return ListExternalCorporaReqOutput(
        success=ok,
        corpus_token_counts=results[0].corpus_token_counts if ok else {},
        message=message,
    )
