"""The llama.cpp engine: lookahead decoding of GGUF models on CPUs (greedy, batch size 1).

- `model`: a GGUF model and a llama.cpp context whose KV sequences hold a tree's branches
- `tree`: a draft tree as one `llama_decode` batch, the greedy verdict, the KV cache after it
- `generator`: `LlamaCppGenerator`, the loop; `plain_generate`, llama.cpp's own greedy decoding

Needs the `llamacpp` extra (llama-cpp-python, built from source with cmake and ninja).
"""

from __future__ import annotations

from lookahead.llamacpp.generator import LlamaCppGenerator, plain_generate
from lookahead.llamacpp.model import LlamaCppModel

__all__ = ["LlamaCppGenerator", "LlamaCppModel", "plain_generate"]
