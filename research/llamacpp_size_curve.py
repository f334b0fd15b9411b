"""Does a llama.cpp verify forward get cheaper per row on bigger models, on this CPU?

    make llama-server      # llama-bench, llama-quantize
    python -m research.llamacpp_size_curve [--sizes 135m,360m,1.7b] [--quant Q4_1] [--threads 1,2,4]

Writes a random-weight llama-architecture GGUF in the shape of each SmolLM2 size (F16, then
`llama-quantize` to `--quant`; random weights decode nonsense, but a forward's cost depends
on the shapes alone), and prints `llama-bench -p W -n 0`'s time of W rows relative to one
row, at each thread count. On the default 135M model a second Q4_1 row costs 1.55-2.3x the
first with 2 threads (BENCHMARKS.md section 7.2), so only near-certain drafts pay; a model
whose weights stream from memory instead of the cache should batch rows nearly for free.
The files go to `benchmarks/out/gguf/random-*` (1.7B: 3.4 GB in F16, ~1 GB in Q4_1).
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / "target" / "llama-server-src" / "build" / "bin"
OUT = ROOT / "benchmarks" / "out" / "gguf"
# SmolLM2's shapes (its config.json): hidden, layers, heads, kv heads, feed-forward.
SHAPES = {
    "135m": (576, 30, 9, 3, 1536),
    "360m": (960, 32, 15, 5, 2560),
    "1.7b": (2048, 24, 32, 32, 8192),
}
VOCAB = 49152
WIDTHS = (1, 2, 3, 4, 8, 16)


def write_random(path: Path, shape) -> None:
    """A random-weight llama GGUF of `shape` in F16 (tied embeddings, no tokenizer)."""
    import gguf

    hidden, layers, heads, kv, ff = shape
    rng = np.random.default_rng(0)

    def w(*s):
        return (rng.standard_normal(s, dtype=np.float32) * 0.02).astype(np.float16)

    hd = hidden // heads
    wr = gguf.GGUFWriter(str(path), "llama")
    wr.add_context_length(2048)
    wr.add_embedding_length(hidden)
    wr.add_block_count(layers)
    wr.add_feed_forward_length(ff)
    wr.add_head_count(heads)
    wr.add_head_count_kv(kv)
    wr.add_rope_dimension_count(hd)
    wr.add_layer_norm_rms_eps(1e-5)
    wr.add_tokenizer_model("none")
    wr.add_vocab_size(VOCAB)
    wr.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    wr.add_tensor("token_embd.weight", w(VOCAB, hidden))
    wr.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    for i in range(layers):
        p = f"blk.{i}."
        wr.add_tensor(p + "attn_norm.weight", np.ones(hidden, np.float32))
        wr.add_tensor(p + "attn_q.weight", w(hidden, hidden))
        wr.add_tensor(p + "attn_k.weight", w(kv * hd, hidden))
        wr.add_tensor(p + "attn_v.weight", w(kv * hd, hidden))
        wr.add_tensor(p + "attn_output.weight", w(hidden, hidden))
        wr.add_tensor(p + "ffn_norm.weight", np.ones(hidden, np.float32))
        wr.add_tensor(p + "ffn_gate.weight", w(ff, hidden))
        wr.add_tensor(p + "ffn_up.weight", w(ff, hidden))
        wr.add_tensor(p + "ffn_down.weight", w(hidden, ff))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()


def model(size: str, quant: str) -> Path:
    out = OUT / f"random-{size}.{quant.upper()}.gguf"
    if out.is_file():
        return out
    OUT.mkdir(parents=True, exist_ok=True)
    f16 = OUT / f"random-{size}.F16.gguf"
    if not f16.is_file():
        write_random(f16, SHAPES[size])
    if quant.upper() != "F16":
        subprocess.run([str(BIN / "llama-quantize"), str(f16), str(out), quant.upper(), "2"],
                       check=True, capture_output=True)  # fmt: skip
        f16.unlink()
    return out


def curve(path: Path, threads: int) -> dict:
    """{W: seconds} of `llama-bench -p W -n 0` (5 repetitions, its mean)."""
    p = ",".join(str(w) for w in WIDTHS)
    out = subprocess.run([str(BIN / "llama-bench"), "-m", str(path), "-p", p, "-n", "0",
                          "-t", str(threads), "-r", "5", "-o", "json"],
                         check=True, capture_output=True, text=True)  # fmt: skip
    return {int(r["n_prompt"]): r["avg_ns"] / 1e9 for r in json.loads(out.stdout)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="135m,360m,1.7b")
    p.add_argument("--quant", default="Q4_1")
    p.add_argument("--threads", default="2")
    args = p.parse_args(argv)
    for size in args.sizes.split(","):
        path = model(size, args.quant)
        for t in (int(x) for x in args.threads.split(",")):
            c = curve(path, t)
            rel = "  ".join(f"W={w} {c[w] / c[1]:.2f}x" for w in WIDTHS[1:])
            print(
                f"{size:>5} {args.quant} {t} threads: W=1 {1e3 * c[1]:6.1f} ms  {rel}", flush=True
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
