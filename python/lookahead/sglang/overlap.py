"""The overlap scheduler's relay: a step's verified tokens that `output_ids` lacks yet.

SGLang's overlap scheduler appends a request's tokens to `output_ids` one step late; the
relay (`batch.spec_info.accept_tokens` / `accept_lens`) holds them meanwhile. A LOOKAHEAD
worker reads them as NGRAM's worker reads them, and records them in the attributes NGRAM's
verify path reads (`prev_token_ids`, `prev_accept_lens`).
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["pending_tokens"]

logger = logging.getLogger("lookahead.sglang.worker")


def pending_tokens(worker: Any, batch: Any) -> list[list[int]] | None:
    """Verified tokens not yet in `output_ids` (overlap mode only).

    The overlap relay holds a request's tokens of its last forward, and keeps them after
    `output_ids` got them when steps without that request came between (another
    request's prefill, an idle step). NGRAM reads only a tail, so the repeat costs it
    nothing; we count every token, so each row is cut to what `output_ids` lacks:
    `seq_lens_cpu[i] + 1` (the root's KV comes next) minus the padded prompt and
    `output_ids`."""
    bs = len(batch.reqs)
    stride = worker.config.width  # the relay is always N per request (`pad_to_width`)
    if not (worker.enable_overlap and not batch.grammar_needs_sync()):
        worker.prev_token_ids, worker.prev_accept_lens = [], [0] * bs
        return None
    tokens, lens = batch.spec_info.accept_tokens, batch.spec_info.accept_lens
    if not tokens.is_cpu:
        tokens, lens = tokens.cpu(), lens.cpu()
    worker.prev_token_ids, worker.prev_accept_lens = tokens.tolist(), lens.tolist()
    if len(worker.prev_accept_lens) != bs:
        raise RuntimeError(
            f"overlap relay carried {len(worker.prev_accept_lens)} accept lengths for a "
            f"batch of {bs}"
        )
    rows = [
        worker.prev_token_ids[i * stride : i * stride + worker.prev_accept_lens[i]]
        for i in range(bs)
    ]
    if batch.seq_lens_cpu is None:
        return rows  # no host lengths: `draft`'s root check still keeps verify exact
    for i, (req, n) in enumerate(zip(batch.reqs, batch.seq_lens_cpu.tolist())):
        missing = n + 1 - len(req.origin_input_ids) - len(req.output_ids)
        if missing > len(rows[i]):
            # Not seen in SGLang 0.5.23; the whole row then, and `draft`'s root check
            # restarts the request if its context came out wrong (verify stays exact).
            logger.warning(
                "lookahead: request %r: SGLang's context has %d tokens beyond output_ids, "
                "the overlap relay only %d",
                req.rid,
                missing,
                len(rows[i]),
            )
        elif missing > 0:
            rows[i] = rows[i][len(rows[i]) - missing :]
        else:
            rows[i] = []
    return rows
