"""The worker's draft preparation, fed SGLang's own `Req` objects, against NGRAM's layout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from array import array
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from lookahead.sglang.config import ServingConfig

pytest.importorskip("sglang", reason="needs sglang==0.5.23: requirements/sglang-test.txt")


def make_worker(width=8, overlap=False, breadth=4, **extra):
    from lookahead.sglang.worker import LookaheadWorker

    args = SimpleNamespace(
        speculative_num_draft_tokens=width,
        speculative_ngram_max_trie_depth=8,
        speculative_ngram_capacity=100_000,
        speculative_ngram_max_bfs_breadth=breadth,
    )
    config = ServingConfig.from_args(args, json.dumps(extra) if extra else None)
    worker = LookaheadWorker.__new__(LookaheadWorker)  # no target model: drafting state only
    worker._init_lookahead(config, device=torch.device("cpu"), enable_overlap=overlap)
    return worker


def make_req(rid, prompt, outputs=(), extra_key=None):
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    req = Req(rid, "", array("q", prompt), SamplingParams(max_new_tokens=64), extra_key=extra_key)
    req.output_ids.extend(outputs)
    return req


def make_batch(reqs, spec_info=None, fresh=None):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    # seq_lens: tokens whose KV exists; the context's last token (the root) is not one.
    # Under the overlap scheduler the relay's `fresh[i]` last tokens (default: all of them)
    # are in SGLang's context but not yet in `output_ids`.
    if fresh is None:
        fresh = [0] * len(reqs) if spec_info is None else spec_info.accept_lens.tolist()
    lens = [len(r.origin_input_ids) + len(r.output_ids) + f - 1 for r, f in zip(reqs, fresh)]
    return SimpleNamespace(
        reqs=reqs,
        seq_lens=torch.tensor(lens, dtype=torch.int64),
        seq_lens_cpu=torch.tensor(lens, dtype=torch.int64),
        seq_lens_sum=sum(lens),
        spec_info=spec_info,
        has_grammar=False,
        grammar_needs_sync=lambda: False,
        forward_mode=ForwardMode.DECODE,
    )


def ngram_tree_mask(parents):
    """NGRAM's ancestor mask from its node parents, as SGLang's C++ `fillResult` builds it
    (kernels/jit/csrc/ngram_corpus/result.cpp): a node's row is its parent's row plus itself."""
    n = len(parents)
    mask = np.zeros((n, n), dtype=bool)
    mask[0, 0] = True
    for i in range(n):
        p = int(parents[i])
        if p != -1:
            mask[i, : p + 1] = mask[p, : p + 1]
        mask[i, i] = True
    return mask


def ngram_full_mask(masks, seq_lens):
    """NGRAM's full mask, as `NGRAMWorker._prepare_for_speculative_decoding` builds it."""
    rows = []
    for mask, seq_len in zip(masks, seq_lens):
        n = mask.shape[0]
        ones = torch.ones((n, int(seq_len)))
        rows.append(
            torch.cat((ones, torch.from_numpy(mask).float()), dim=1).to(torch.bool).flatten()
        )
    return torch.cat(rows)


# Repeats "5 6 7" with different continuations, so the tree branches.
BRANCHY = [5, 6, 7, 8, 1, 5, 6, 7, 3, 2, 5, 6, 7, 8, 4, 9, 5, 6]


def branchy_batch():
    return make_batch(
        [
            make_req("a", BRANCHY, [7]),
            make_req("b", [11, 12, 13, 11, 12, 14, 11, 12, 13, 15, 11], [12]),
            make_req("c", [40, 41, 42], [43]),  # nothing to match: root + NGRAM padding
        ]
    )


def test_verify_input_matches_ngrams_for_the_same_trees(plugins_loaded):
    from sglang.srt.speculative.ngram_worker import _derive_tree_links

    worker = make_worker(width=8)
    batch = branchy_batch()
    tokens, parents, vt = worker._build_verify_tensors(batch)
    bs, n = tokens.shape
    assert (bs, n) == (3, 8)

    # Node 0 is each request's last verified token; drafts are the cache's.
    assert tokens[:, 0].tolist() == [7, 12, 43]
    counts = np.bincount(parents[0][1:], minlength=n)
    assert counts.max() >= 2, "the first tree must branch for this test to mean anything"
    assert tokens[0, 1:3].tolist() == [8, 3]  # "5 6 7" -> 8 (twice), 3 (once), best first
    assert (tokens[2, 1:] == 0).all() and (parents[2, 1:] == 0).all()  # NGRAM's padding

    masks = np.stack([ngram_tree_mask(parents[b]) for b in range(bs)])
    next_token, next_sibling = _derive_tree_links(masks.reshape(-1), bs, n)
    # One departure from NGRAM: no link reaches padding (request c: the root alone).
    assert vt.num_nodes.tolist() == [8, 8, 1]
    assert next_token[2, 0] == 1 and vt.retrieve_next_token[2, 0] == -1
    next_token[2], next_sibling[2] = -1, -1
    seq_lens = batch.seq_lens
    assert vt.draft_tokens.dtype == torch.int64 and vt.draft_tokens.shape == (bs * n,)
    assert vt.draft_tokens.tolist() == tokens.reshape(-1).tolist()
    # NGRAM's reconstruct_indices_from_tree_mask contract (reconstruct_tree.py docstring).
    expect_pos = (torch.from_numpy(masks.sum(-1) - 1) + seq_lens[:, None]).reshape(-1)
    assert vt.positions.dtype == torch.int64 and torch.equal(vt.positions, expect_pos)
    assert torch.equal(vt.retrieve_index, torch.arange(bs * n).view(bs, n))
    assert torch.equal(vt.retrieve_next_token, next_token)
    assert torch.equal(vt.retrieve_next_sibling, next_sibling)
    for t in (vt.retrieve_index, vt.retrieve_next_token, vt.retrieve_next_sibling):
        assert t.dtype == torch.int64 and t.shape == (bs, n)
    # NGRAM's choice between its full mask and the N x N tree mask, on this machine.
    from sglang.srt.speculative.ngram_worker import USE_FULL_MASK, _is_cpu

    if USE_FULL_MASK and not _is_cpu:
        expect_mask = ngram_full_mask(list(masks), seq_lens.tolist())
    else:
        expect_mask = torch.from_numpy(masks).reshape(-1)
    assert torch.equal(vt.custom_mask, expect_mask)


@pytest.mark.parametrize("full_mask", [True, False])
def test_both_mask_layouts_match_ngrams(plugins_loaded, full_mask):
    from lookahead.sglang.verify import build_verify_tensors

    worker = make_worker(width=8)
    batch = branchy_batch()
    tokens, parents, *_ = worker._prepare_draft_tokens(batch)
    vt = build_verify_tensors(
        tokens, parents, batch.seq_lens, batch.seq_lens_sum, full_mask=full_mask
    )
    masks = [ngram_tree_mask(p) for p in parents]
    if full_mask:
        expect = ngram_full_mask(masks, batch.seq_lens.tolist())
    else:
        expect = torch.from_numpy(np.stack(masks)).reshape(-1)
    assert vt.custom_mask.dtype == torch.bool and torch.equal(vt.custom_mask, expect)


_NGRAM_KERNEL = r"""
import json, os, sys
sys.path.insert(0, os.environ["CONFTEST_DIR"])
import conftest  # puts the sgl_kernel stand-in on sys.path
import torch
from sglang.kernels.ops.speculative.reconstruct_tree import (
    reconstruct_indices_from_tree_mask_triton,
)
inp = json.loads(sys.stdin.read())
bs, n = inp["bs"], inp["n"]
mask = torch.tensor(inp["mask"], dtype=torch.bool)
seq = torch.tensor(inp["seq_lens"], dtype=torch.int64)
pos = torch.empty(bs * n, dtype=torch.int64)
ri, nt, ns = (torch.empty((bs, n), dtype=torch.int64) for _ in range(3))
reconstruct_indices_from_tree_mask_triton(mask, seq, pos, ri, nt, ns, bs, n)
print(json.dumps([pos.tolist(), ri.tolist(), nt.tolist(), ns.tolist()]))
"""


def test_metadata_matches_sglangs_own_ngram_kernel(plugins_loaded):
    """SGLang's NGRAM metadata kernel itself (its Triton kernel, run by Triton's CPU
    interpreter in a subprocess, since the interpreter is chosen at import) on our trees."""
    worker = make_worker(width=8)
    batch = branchy_batch()
    tokens, parents, vt = worker._build_verify_tensors(batch)
    bs, n = tokens.shape
    masks = np.stack([ngram_tree_mask(p) for p in parents])
    payload = {
        "bs": bs,
        "n": n,
        "mask": masks.reshape(-1).tolist(),
        "seq_lens": batch.seq_lens.tolist(),
    }
    env = {**os.environ, "TRITON_INTERPRET": "1", "CONFTEST_DIR": str(Path(__file__).parent)}
    out = subprocess.run(
        [sys.executable, "-c", _NGRAM_KERNEL],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    pos, ri, nt, ns = json.loads(out.stdout.strip().splitlines()[-1])
    assert vt.positions.tolist() == pos
    assert vt.retrieve_index.tolist() == ri
    # The one departure from NGRAM: no link reaches padding (request c: the root alone).
    assert vt.num_nodes.tolist() == [8, 8, 1] and nt[2][0] == 1
    nt[2], ns[2] = [-1] * len(nt[2]), [-1] * len(ns[2])
    assert vt.retrieve_next_token.tolist() == nt
    assert vt.retrieve_next_sibling.tolist() == ns


def test_drafts_from_the_whole_prompt_which_ngram_cannot(plugins_loaded):
    """The phrase 50..55 lies far before the prompt's tail. NGRAM's corpus gets only the last
    `--speculative-ngram-max-trie-depth` (18) tokens per step, so on the first decode step it
    has never seen the phrase; LOOKAHEAD indexed the whole prompt."""
    phrase = [50, 51, 52, 53, 54, 55]
    prompt = list(range(100, 140)) + phrase + list(range(200, 240)) + [50, 51]
    context = prompt + [52]
    assert 53 not in context[-18:]
    worker = make_worker(width=8, breadth=1)  # single branch: the chain itself
    tokens, parents, _ = worker._build_verify_tensors(make_batch([make_req("r", prompt, [52])]))
    assert tokens[0, 0] == 52
    assert tokens[0, 1:].tolist() == [53, 54, 55, 200, 201, 202, 203]
    assert parents[0].tolist() == [-1, 0, 1, 2, 3, 4, 5, 6]


def test_outputs_stream_and_departed_requests_finish(plugins_loaded):
    worker = make_worker(width=6)
    cache = worker.drafter.cache
    prompt = [1, 2, 3, 4, 9, 1, 2]
    req = make_req("s", prompt, [3])
    tokens = worker._prepare_draft_tokens(make_batch([req])).tokens
    assert tokens[0, :2].tolist() == [3, 4]
    assert cache.stats()["live_requests"] == 1
    req.output_ids.extend([4, 9])  # verified since the last step: root moves to 9
    tokens = worker._prepare_draft_tokens(make_batch([req])).tokens
    assert tokens[0, :3].tolist() == [9, 1, 2]
    assert worker.drafter._ctx_len["s"] == len(prompt) + 3
    # NGRAMWorker's verify path reports departed rids through ngram_corpus.erase_match_state.
    worker.ngram_corpus.erase_match_state(["s", "never-seen"])
    assert cache.stats()["live_requests"] == 0 and worker.drafter.live_requests == frozenset()


def test_overlap_mode_splices_pending_tokens_once(plugins_loaded):
    """Under the overlap scheduler the last step's accepted tokens are not yet in
    `output_ids`; they come from `spec_info.accept_tokens` / `accept_lens`, as NGRAM reads them."""
    width = 6
    worker = make_worker(width=width, overlap=True)
    prompt = [1, 2, 3, 4, 5, 6, 7, 1, 2]
    req = make_req("o", prompt, [3])

    def relay(pending):
        buf = torch.zeros(width, dtype=torch.int64)
        buf[: len(pending)] = torch.tensor(pending)
        return SimpleNamespace(accept_tokens=buf, accept_lens=torch.tensor([len(pending)]))

    tokens = worker._prepare_draft_tokens(make_batch([req], relay([4, 5]))).tokens
    assert tokens[0, :3].tolist() == [5, 6, 7]
    req.output_ids.extend([4, 5])  # the scheduler appends them one step late
    tokens = worker._prepare_draft_tokens(make_batch([req], relay([6]))).tokens
    assert tokens[0, :3].tolist() == [6, 7, 1]
    assert worker.drafter._ctx_len["o"] == len(prompt) + 4  # nothing counted twice
    assert worker.prev_accept_lens == [1]


def test_overlap_relay_already_in_output_ids_is_not_counted_again(plugins_loaded):
    """The relay row keeps a request's tokens until its next forward: after a step without
    it (another request's prefill), `output_ids` holds them too. Only what SGLang's length
    says is missing may be added; else the cache's context runs ahead and a later tree
    starts from a stale root (not lossless)."""
    width = 6
    worker = make_worker(width=width, overlap=True, breadth=1)
    prompt = list(range(1, 11))
    req = make_req("a", prompt)
    ctx = prompt + [100]

    def relay(toks):
        buf = torch.zeros(width, dtype=torch.int64)
        buf[: len(toks)] = torch.tensor(toks)
        return SimpleNamespace(accept_tokens=buf, accept_lens=torch.tensor([len(toks)]))

    def decode(row, fresh, emitted):
        tokens = worker._prepare_draft_tokens(make_batch([req], relay(row), [fresh])).tokens
        assert tokens[0, 0] == ctx[-1]
        assert worker.drafter._ctx_len["a"] == len(ctx)
        ctx.extend(emitted)

    decode([100], 1, [101, 102])  # the prefill's token is still in flight
    req.output_ids.extend([100, 101, 102])  # another request's prefill step came between
    decode([101, 102], 0, [103, 104])  # the relay row is stale: all of it is in output_ids
    decode([103, 104], 2, [105])
    req.output_ids.extend([103, 104])
    decode([105], 1, [106])


def test_a_tree_from_a_wrong_context_gets_the_right_root_and_restarts(plugins_loaded):
    drafter = make_worker(width=6).drafter
    req = make_req("r", [5, 6, 7, 8], [9])
    roots = drafter.sync([req])
    assert roots.tolist() == [9]
    drafter.cache.extend("r", [42])  # the cache's context diverges from SGLang's
    tokens = drafter.draft(["r"], roots).tokens
    assert tokens[0, 0] == 9  # verify feeds the true last token: still exact
    before = _history_score_after(drafter, 8)
    drafter.sync([req])
    assert drafter._ctx_len["r"] == 5
    assert drafter.cache.draft("r", budget=1).tokens[0] == 9  # the cache has it right again
    # Its outputs were in the shared history already: the restart counts none there again.
    assert _history_score_after(drafter, 8) == before


def test_namespaces_isolate_tenants(plugins_loaded):
    worker = make_worker(width=6, breadth=1, namespace="extra_key")
    writer = make_req("w", [1, 2], [3], extra_key="t1")
    worker._prepare_draft_tokens(make_batch([writer]))
    writer.output_ids.extend([70, 71, 72, 73])
    worker._prepare_draft_tokens(make_batch([writer]))
    same = make_req("x", [9, 9], [70], extra_key="t1")
    other = make_req("y", [9, 9], [70], extra_key="t2")
    tokens = worker._prepare_draft_tokens(make_batch([same, other])).tokens
    assert tokens[0, 1:3].tolist() == [71, 72]  # t1 drafts from t1's outputs
    assert (tokens[1, 1:] == 0).all()  # t2 never sees them
    assert worker.drafter.namespace_of(same) != worker.drafter.namespace_of(other)


def test_budget_below_width_pads_like_ngram(plugins_loaded):
    worker = make_worker(width=8, breadth=1, budget=3)
    tokens, parents, vt = worker._build_verify_tensors(
        make_batch([make_req("r", [5, 6, 7, 8, 9, 10, 5], [6])])
    )
    assert tokens[0].tolist() == [6, 7, 8, 9, 0, 0, 0, 0]
    assert parents[0].tolist() == [-1, 0, 1, 2, 0, 0, 0, 0]
    assert vt.draft_tokens.shape == (8,)


def test_prefill_batches_are_left_alone(plugins_loaded):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    worker = make_worker()
    batch = make_batch([make_req("p", [1, 2, 3], [4])])
    batch.forward_mode = ForwardMode.EXTEND
    worker._prepare_for_speculative_decoding(batch)
    assert batch.spec_info is None and worker.drafter.live_requests == frozenset()


def test_synchronous_indexing_for_multi_rank_drafts(plugins_loaded):
    worker = make_worker(width=6, breadth=1, background_indexing=False)
    assert worker.drafter.cache.config["background_indexing"] is False
    tokens = worker._prepare_draft_tokens(make_batch([make_req("m", [1, 2, 3, 1, 2], [3])])).tokens
    assert tokens[0, :2].tolist() == [3, 1]


class _TailOnly(list):
    """An `output_ids` list that records what `sync` reads: only slices, no full copies."""

    def __init__(self, *a):
        super().__init__(*a)
        self.reads = []

    def __iter__(self):
        raise AssertionError("sync must not walk the whole output list")

    def __getitem__(self, i):
        self.reads.append(i)
        return list.__getitem__(self, i)


def test_sync_reads_only_the_new_tokens(plugins_loaded):
    drafter = make_worker(width=6).drafter
    prompt = array("q", [1, 2, 3, 4, 9, 1, 2])
    req = SimpleNamespace(rid="t", origin_input_ids_unpadded=prompt, output_ids=_TailOnly([3]))
    drafter.sync([req])
    list.extend(req.output_ids, [4, 9, 1])
    drafter.sync([req])
    drafter.sync([req])  # nothing new: nothing read
    # Slices of the new tokens, and the last token (each tree's root is checked against it).
    assert req.output_ids.reads == [-1, slice(0, None), -1, slice(1, None), -1]
    assert drafter._ctx_len["t"] == 7 + 4
    # The context ends "4 9 1": the prompt says 2 comes next.
    assert drafter.cache.draft("t", budget=1, multi_branch=False).tokens.tolist() == [1, 2]


def test_a_failed_sync_resends_on_the_next_one(plugins_loaded):
    from lookahead import InvalidInput

    drafter = make_worker(width=6).drafter

    def req(rid, prompt, out):
        return SimpleNamespace(
            rid=rid, origin_input_ids_unpadded=array("q", prompt), output_ids=out
        )

    a, b = req("a", [1, 2, 3], []), req("b", [4, 5, 6], [])
    drafter.sync([a, b])
    a.output_ids += [7, 8]
    b.output_ids += [2**40]  # not a token id: the whole batch's extend is refused
    with pytest.raises(InvalidInput):
        drafter.sync([a, b])
    assert drafter._ctx_len == {"a": 3, "b": 3}  # as the cache has them
    b.output_ids[-1] = 11
    drafter.sync([a, b])
    assert drafter._ctx_len == {"a": 5, "b": 4}
    # "a" got 7 8 after all: its context ends "3 7 8", and the prompt says nothing after 8.
    c = drafter.cache
    c.finish_request("b")
    c.start_request("q", [3, 7])
    assert c.draft("q", budget=1, multi_branch=False).tokens.tolist() == [7, 8]
    with pytest.raises(ValueError, match="appears twice"):
        drafter.sync([a, a])


def test_a_retracted_request_restarts_without_recounting_its_outputs(plugins_loaded):
    """Retraction gives a request back with fewer tokens: it restarts from its whole
    (shorter) context, its own trie indexing it all and the shared history untouched."""
    drafter = make_worker(width=6, breadth=1).drafter
    req = make_req("r", [5, 6, 7, 8], [9, 10, 11])
    drafter.sync([req])
    before = _history_score_after(drafter, 8)
    del req.output_ids[1:]  # re-admitted after a retraction: only 9 survived
    roots = drafter.sync([req])
    assert roots.tolist() == [9] and drafter._ctx_len["r"] == 5
    assert _history_score_after(drafter, 8) == before  # "8 9" not counted again
    req.output_ids.extend([10, 11])
    drafter.sync([req])  # new tokens stream in as usual
    assert drafter._ctx_len["r"] == 7
    assert drafter.cache.draft("r", budget=1).tokens[0] == 11


def _history_score_after(drafter, token):
    """The score of the shared history's best continuation of `token`, drafted for a probe
    request whose own text has no continuation of it (a count counted twice scores higher)."""
    drafter.cache.start_request("probe", [1000, token])
    score = float(drafter.cache.draft("probe", budget=1).scores[1])
    drafter.cache.finish_request("probe")
    return score


def test_a_restart_merges_only_the_prompt_when_keeping_prompts(plugins_loaded):
    """With keep_prompt_as_history, a restarted request's prompt reaches the shared history
    once, at its finish, as for a request never restarted (not its whole context, not twice)."""

    def history_after(restart):
        drafter = make_worker(width=6, breadth=1, keep_prompt_as_history=True).drafter
        req = make_req("r", [5, 6, 7, 8], [9, 10, 11])
        roots = drafter.sync([req])
        if restart:
            drafter.cache.extend("r", [42])  # a wrong context: restarted at the next sync
            drafter.draft(["r"], roots)
            drafter.sync([req])
        drafter.finish(["r"])
        return [_history_score_after(drafter, t) for t in (6, 9)]

    assert history_after(True) == history_after(False)


def test_a_relay_shorter_than_sglangs_length_warns_and_drafts_on(plugins_loaded, caplog):
    width = 6
    worker = make_worker(width=width, overlap=True)
    req = make_req("s", [1, 2, 3, 4], [5])
    buf = torch.zeros(width, dtype=torch.int64)
    buf[0] = 6
    relay = SimpleNamespace(accept_tokens=buf, accept_lens=torch.tensor([1]))
    with caplog.at_level("WARNING"):
        tokens = worker._prepare_draft_tokens(make_batch([req], relay, [3])).tokens
    assert "the overlap relay only 1" in caplog.text
    assert tokens[0, 0] == 6  # the row is used whole; no crash of the scheduler


def test_departed_requests_end_before_new_prompts_are_indexed(plugins_loaded):
    worker = make_worker(width=6)
    a, b = make_req("a", [1, 2, 3, 4], [5]), make_req("b", [7, 8, 9], [10])
    worker._prepare_draft_tokens(make_batch([a]))
    worker._prev_decode_rids = {"a"}  # as NGRAM's verify path records the batch
    worker._prepare_draft_tokens(make_batch([b]))
    # "a" is gone before "b"'s prompt is indexed (NGRAM's own erase comes after the verify).
    assert worker.drafter.live_requests == {"b"}
    assert worker.drafter.cache.stats()["live_requests"] == 1


def test_a_retracted_request_is_held_and_resumes_without_recounting(plugins_loaded):
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    worker = make_worker(width=6, breadth=1)
    drafter = worker.drafter
    r, x = make_req("r", [5, 6, 7, 8], [9, 10, 11]), make_req("x", [30, 31], [32])
    worker._prepare_draft_tokens(make_batch([r, x]))
    worker._prev_decode_rids = {"r", "x"}
    before = _history_score_after(drafter, 8)
    r.is_retracted = True  # SGLang's retract_decode: out of the batch, output_ids kept
    worker._prepare_draft_tokens(make_batch([x]))
    worker.ngram_corpus.erase_match_state(["r"])  # NGRAM's end-of-step erase passes it by
    worker._prev_decode_rids = {"x"}
    assert drafter.live_requests == {"r", "x"}
    r.is_retracted = False  # re-admitted with its outputs, then one more token
    r.output_ids.append(12)
    worker._prepare_draft_tokens(make_batch([r, x]))
    assert drafter._ctx_len["r"] == 8 and drafter.cache.draft("r", budget=1).tokens[0] == 12
    assert _history_score_after(drafter, 8) == before  # "8 9" not counted again
    # Retracted again and aborted while waiting: ended at the next step.
    worker._prev_decode_rids = {"r", "x"}
    r.is_retracted = True
    worker._prepare_draft_tokens(make_batch([x]))
    assert drafter.live_requests == {"r", "x"}
    r.finished_reason = FINISH_ABORT()
    worker._prepare_draft_tokens(make_batch([x]))
    assert drafter.live_requests == {"x"}


def test_request_namespaces_share_nothing_and_keep_no_history(plugins_loaded):
    worker = make_worker(width=6, breadth=1, namespace="request")
    writer = make_req("w", [1, 2], [3, 70, 71, 72, 73])
    worker._prepare_draft_tokens(make_batch([writer]))
    reader = make_req("r", [9, 9], [70])
    tokens = worker._prepare_draft_tokens(make_batch([writer, reader])).tokens
    assert (tokens[1, 1:] == 0).all()  # never drafts from another request's outputs
    assert tokens[0, :1].tolist() == [73]
    writer.output_ids.extend([1, 2, 3])
    tokens = worker._prepare_draft_tokens(make_batch([writer, reader])).tokens
    assert tokens[0, 1:3].tolist() == [70, 71]  # but from its own outputs
    worker.drafter.finish(["w", "r"])
    # No shared history (and no namespace per request) outlives the requests.
    assert worker.drafter.cache.stats()["nodes"] == 0


def test_cpu_steps_narrow_only_where_proven(plugins_loaded):
    """Narrower verify steps need CPU, no overlap relay, the plugin's tree attention, and a
    batch whose rows (logprobs, hidden states) are not read at NGRAM's N per request."""
    from lookahead.sglang.worker import LookaheadWorker
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    def batch(bs, **kw):
        fields = dict(return_logprob=False, return_hidden_states=False)
        fields.update(kw)
        return SimpleNamespace(forward_mode=ForwardMode.DECODE, reqs=[None] * bs, **fields)

    rule = make_worker(width=8, max_verify_rows=64)  # CPU, the tree backend, 64 rows
    assert [rule._step_width(batch(bs)) for bs in (1, 8, 9, 16, 64, 65)] == [8, 8, 7, 4, 1, 1]
    worker = make_worker(width=8)  # the default: the sizer chooses after drafting
    assert worker.sizer is not None and rule.sizer is None
    assert [worker._step_width(batch(bs)) for bs in (1, 16, 65)] == [None, None, None]
    assert worker._step_width(batch(16, return_logprob=True)) == 8
    assert worker._step_width(batch(16, return_hidden_states=True)) == 8
    extend = SimpleNamespace(forward_mode=ForwardMode.EXTEND, reqs=[None] * 16)
    assert worker._step_width(extend) == 8
    assert make_worker(width=8, overlap=True)._step_width(batch(16)) == 8
    cuda = LookaheadWorker.__new__(LookaheadWorker)
    cuda._init_lookahead(worker.config, device=torch.device("cuda"), enable_overlap=False)
    assert [cuda._step_width(batch(bs)) for bs in (1, 16, 48)] == [8, 8, 8]
    amx = LookaheadWorker.__new__(LookaheadWorker)
    amx._init_lookahead(
        worker.config,
        device=torch.device("cpu"),
        enable_overlap=False,
        attention_backend="intel_amx",
    )
    assert amx._step_width(batch(16)) == 8


def test_a_narrow_steps_tokens_are_padded_back_to_n(plugins_loaded):
    from lookahead.sglang.verify import pad_to_width

    worker = make_worker(width=4)
    ids = torch.tensor([5, 6, 7, 8, 9, 10])  # 3 requests at width 2
    relay = SimpleNamespace(
        new_seq_lens=torch.tensor([3, 4, 5]), accept_lens=torch.tensor([2, 1, 2])
    )
    result = SimpleNamespace(next_token_ids=ids, next_draft_input=relay)
    pad_to_width(result, bs=3, width=2, full=worker.config.width)
    assert result.next_token_ids.tolist() == [5, 6, 0, 0, 7, 8, 0, 0, 9, 10, 0, 0]
    nxt = result.next_draft_input
    assert nxt.draft_token_num == 4 and nxt.accept_tokens is result.next_token_ids
    assert nxt.accept_lens.tolist() == [2, 1, 2] and nxt.new_seq_lens.tolist() == [3, 4, 5]


def test_the_sizer_sets_a_cpu_steps_width_after_drafting(plugins_loaded):
    """Where `_step_width` leaves the width to the sizer, the drafts are cut to its choice:
    with forwards that cost their rows and drafts that never land, the root alone."""
    worker = make_worker(width=8, breadth=1)
    req = make_req("r", [5, 6, 7, 8, 9, 10, 11, 12] * 4, [5])
    req.sampling_params.top_k = 1  # greedy, as SGLang makes temperature 0
    widths = []
    for step in range(48):
        worker._fixed_width = None  # as forward_batch_generation leaves a narrow CPU step
        worker.draft_token_num = worker.config.width
        tokens, parents, vt = worker._build_verify_tensors(make_batch([req]))
        w = worker.draft_token_num
        assert tokens.shape == (1, w) and vt.draft_tokens.shape == (w,)
        assert parents[0, 0] == -1 and (parents[0, 1:] < np.arange(1, w)).all()
        widths.append(w)
        worker.sizer.observe(0.01 * w, 0.001, [[900 + step]])  # the target goes its own way
        req.output_ids.append(900 + step)
    assert widths[0] > 1  # a fresh sizer trusts the drafts' scores
    assert widths[-8:].count(1) >= 6, widths  # and learns they do not land


def test_padding_nodes_can_never_be_accepted(plugins_loaded):
    """A tree of fewer nodes than the width is padded (token 0, a child of the root, as
    NGRAM pads): no link may reach a padding node, or a model whose next token is 0 would
    accept a draft nobody drafted (a switched-off request 'accepting' one)."""
    from lookahead.sglang.verify import build_verify_tensors

    tokens = np.array([[7, 0, 0, 0], [7, 8, 0, 0]], dtype=np.int32)
    parents = np.array([[-1, 0, 0, 0], [-1, 0, 0, 0]], dtype=np.int32)
    seq_lens = torch.tensor([5, 6])
    vt = build_verify_tensors(
        tokens, parents, seq_lens, 11, full_mask=False, num_nodes=np.array([1, 2])
    )
    assert vt.retrieve_next_token.tolist() == [[-1, -1, -1, -1], [1, -1, -1, -1]]
    assert vt.retrieve_next_sibling.tolist() == [[-1] * 4, [-1] * 4]
    assert vt.retrieve_index.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]  # as SGLang reads it
    assert vt.num_nodes.tolist() == [1, 2]
    everything = build_verify_tensors(tokens, parents, seq_lens, 11, full_mask=False)
    assert everything.retrieve_next_token[0, 0] == 1  # without num_nodes, padding is a draft
