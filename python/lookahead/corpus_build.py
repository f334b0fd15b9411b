"""`lookahead corpus build`: a corpus tokenized once, offline, into a save file a LOOKAHEAD
server starts from (`LOOKAHEAD_CONFIG` `{"load": FILE}`), so a large corpus is not tokenized
at every start.

Inputs: `.jsonl` files in NGRAM's format (one JSON string per line, one document each; a bad
line stops the build naming the file and line) and any other file as one UTF-8 document.
Tokenized with the model folder's own tokenizer (local files only), as SGLang's reader does
(no special tokens). Memory: 4 bytes a token while reading, then the trie, which
`--speculative-ngram-capacity` bounds (the corpus takes at most half of it; past that it is
cut, and the summary says so). The file's trie settings are resolved exactly as the server
resolves them, from the same SGLang flags and `LOOKAHEAD_CONFIG`, with the same tokenizer
fingerprint: a server started with other settings or another tokenizer refuses the file
with one line.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

__all__ = ["add_parser", "build"]

# SGLang's defaults for the flags the trie settings come from.
DEFAULT_DEPTH = 18
DEFAULT_CAPACITY = 10_000_000
DEFAULT_MAX_TOKENS = 10_000_000
PROGRESS_EVERY_S = 2.0


def add_parser(sub: Any) -> None:
    corpus = sub.add_parser("corpus", help="corpora for a LOOKAHEAD server, built offline")
    verbs = corpus.add_subparsers(dest="corpus_command", required=True)
    b = verbs.add_parser(
        "build",
        help="tokenize text / JSONL files into a save file a server loads at start-up",
    )
    b.add_argument("files", nargs="+", type=Path, help=".jsonl (NGRAM's format) or text files")
    b.add_argument("--model", required=True, type=Path, help="the served model's HF folder")
    b.add_argument("-o", "--output", required=True, type=Path, help="the save file to write")
    b.add_argument("--id", help="the corpus id (default: the output file's name)")
    b.add_argument("--extra-key", help="serve only requests with this extra_key (default: all)")
    b.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    b.add_argument("--speculative-ngram-max-trie-depth", type=int, default=DEFAULT_DEPTH)
    b.add_argument("--speculative-ngram-capacity", type=int, default=DEFAULT_CAPACITY)
    b.add_argument("--lookahead-config", help="the server's LOOKAHEAD_CONFIG JSON")


def _documents(path: Path):
    """(document, where) pairs of one input file: NGRAM's JSONL, or one text document."""
    from lookahead.errors import LookaheadConfigError
    from lookahead.sglang.corpora import jsonl_documents

    if path.suffix != ".jsonl":
        yield path.read_text(encoding="utf-8"), str(path)
        return
    try:
        for n, doc in jsonl_documents(path):
            yield doc, f"{path}:{n}"
    except LookaheadConfigError as e:
        raise ValueError(f"{path}: {e}") from None


def build(args: Any, out: Any = None) -> dict[str, Any]:
    """Builds the corpus file; returns what `corpus build` prints (to `out`, default the
    stdout of the moment)."""
    from transformers import AutoConfig, AutoTokenizer

    from lookahead.sglang.config import ServingConfig
    from lookahead.sglang.drafter import LookaheadDrafter
    from lookahead.sglang.warm import Saver, fingerprint

    for f in args.files:
        if not f.is_file():
            raise ValueError(f"{f}: no such file")
    if args.max_tokens <= 0:
        raise ValueError("--max-tokens must be positive")
    flags = SimpleNamespace(
        speculative_num_draft_tokens=8,  # the draft width does not reach the file
        speculative_ngram_max_trie_depth=args.speculative_ngram_max_trie_depth,
        speculative_ngram_capacity=args.speculative_ngram_capacity,
        speculative_ngram_max_bfs_breadth=10,
    )
    config = ServingConfig.from_args(flags, args.lookahead_config)
    drafter = LookaheadDrafter(config)
    tok = AutoTokenizer.from_pretrained(args.model, local_files_only=True)
    vocab = AutoConfig.from_pretrained(args.model, local_files_only=True).vocab_size
    docs: list[np.ndarray] = []
    total, started, shown = 0, time.monotonic(), time.monotonic()
    for f in args.files:
        for text, where in _documents(f):
            ids = tok.encode(text, add_special_tokens=False)
            if not ids:
                continue
            if total + len(ids) > args.max_tokens:
                raise ValueError(
                    f"{where}: the corpus passes --max-tokens {args.max_tokens} after "
                    f"{total} tokens"
                )
            docs.append(np.asarray(ids, dtype=np.uint32))
            total += len(ids)
            if time.monotonic() - shown > PROGRESS_EVERY_S:
                shown = time.monotonic()
                print(f"  {len(docs)} documents, {total} tokens ({where})", file=sys.stderr)
    key = args.extra_key
    scope = None if key is None else drafter.namespace_of_key(key)
    corpus_id = args.id or args.output.name
    info = drafter.cache.add_corpus(corpus_id, docs, namespace=scope)
    meta = fingerprint(tok, vocab)
    if not Saver(str(args.output), 0, meta).save(drafter.cache, "corpus build"):
        raise OSError(f"cannot write {args.output} (the log line above says why)")
    summary = {
        **info,
        "documents": len(docs),
        "file": str(args.output),
        "file_bytes": args.output.stat().st_size,
        "seconds": round(time.monotonic() - started, 2),
    }
    cut = (
        f"; CUT at {info['tokens']} of {total} tokens: raise --speculative-ngram-capacity"
        if info["cut"]
        else ""
    )
    print(
        f"corpus {corpus_id!r}: {len(docs)} documents, {info['tokens']} tokens, "
        f"{info['nodes']} trie nodes, {summary['file_bytes']} bytes in {args.output}"
        f'{cut}; serve it with LOOKAHEAD_CONFIG \'{{"load": "{args.output}"}}\' and the '
        "same --speculative-ngram-* flags",
        file=sys.stdout if out is None else out,
    )
    return summary
