"""Smoke test of an installed wheel, run from outside the checkout (tests/wheel/run.sh).

Checks what a user's first minutes touch: the package imports from site-packages (not the
source tree), its data files are there, the commit a result header records, a cache round
trip (start, extend, draft, save, load), the kernels' CPU path, `lookahead --help`, and
`lookahead generate` on a tiny model built here (no download).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path


def check(cond: bool, what: str) -> None:
    if not cond:
        raise SystemExit(f"wheel smoke: FAILED: {what}")
    print(f"ok  {what}")


def tiny_model_folder(path: Path) -> None:
    """A 2-layer Llama with a byte-level tokenizer, saved as an HF model folder."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {"<s>": 0, "</s>": 1, **{ch: i + 2 for i, ch in enumerate(sorted(alphabet))}}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=0, eos_token_id=1, pad_token_id=0,
    )  # fmt: skip
    LlamaForCausalLM(cfg).eval().save_pretrained(path)
    fast.save_pretrained(path)


def main() -> int:
    import lookahead
    import numpy as np
    from lookahead import LookaheadCache, kernels

    here = Path(__file__).resolve().parents[2]
    installed = Path(lookahead.__file__).resolve()
    check(here not in installed.parents, f"lookahead imports from the wheel ({installed})")
    data = installed.parent / "data"
    for name in ("spec_bench_sample.jsonl", "LICENSE.spec_bench", "NOTICE"):
        check((data / name).is_file(), f"package data {name}")
    for name in ("py.typed", "_core.pyi"):
        check((installed.parent / name).is_file(), f"package file {name}")
    # The product only: the benchmarks and their peer adapters stay in the repository.
    shipped = {p.relative_to(installed.parent).parts[0] for p in installed.parent.rglob("*.py")}
    check("bench" not in shipped and "peers" not in shipped, "no benchmark code in the wheel")
    # Result headers: an installed package names no commit; a run from the clone names it.
    from lookahead.output import git_commit

    check(git_commit() == "unknown", "an installed package records no commit")
    if (here / ".git").exists():  # not in a copy without history (an unpacked sdist)
        named = git_commit(here / "benchmarks") != "unknown"
        check(named, "a run from the clone records its commit")

    c = LookaheadCache(max_depth=4, capacity_nodes=10_000, background_indexing=False)
    c.start_request(1, [5, 6, 7, 5, 6])
    c.extend(1, [7, 5])
    d = c.draft(1, budget=4)
    check(d.tokens.tolist()[:3] == [5, 6, 7], f"draft after extend: {d.tokens.tolist()}")
    with tempfile.TemporaryDirectory() as tmp:
        c.finish_request(1, keep_prompt=True)
        c.save(Path(tmp) / "h.bin")
        e = LookaheadCache.load(Path(tmp) / "h.bin")
        check(e.stats()["history_nodes"] == c.stats()["history_nodes"], "save / load round trip")

    import torch

    parents = torch.tensor([[-1, 0, 1, 0]], dtype=torch.int32)
    one = torch.tensor([4], dtype=torch.int32)
    meta = kernels.tree_metadata(parents, one, torch.tensor([10], dtype=torch.int32))
    ok = meta.mask.shape == (1, 4, 4) and bool(meta.mask[0, 2, 1]) and not meta.mask[0, 3, 1]
    check(ok and meta.positions.tolist() == [[10, 11, 12, 11]], "kernels' CPU path")

    run = [sys.executable, "-m", "lookahead.cli"]
    out = subprocess.run([*run, "--help"], capture_output=True, text=True, check=True)
    check("generate" in out.stdout, "lookahead --help")
    with tempfile.TemporaryDirectory() as tmp:
        tiny_model_folder(Path(tmp) / "tiny")
        out = subprocess.run(
            [*run, "generate", "--model", str(Path(tmp) / "tiny"), "--prompt", "abcabcabc",
             "--max-new-tokens", "8", "--no-chat", "--dtype", "float32"],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        ok = out.returncode == 0 and "[8 tokens in" in out.stderr
        check(ok, f"lookahead generate (rc {out.returncode}): {out.stderr[-800:]}")
    print(f"wheel smoke: all passed ({np.__version__=})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
