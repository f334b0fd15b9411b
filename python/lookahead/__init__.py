"""lookahead: lossless, training-free speculative decoding from a trie of n-grams.

The trie (`LookaheadCache`) is a Rust core; the HF transformers engine (`generate`,
`LookaheadGenerator`) needs the `hf` extra and is imported on first use, so `import lookahead`
stays light and never imports torch, triton or sglang.
"""

from __future__ import annotations

from lookahead.cache import BatchDraft, Draft, LookaheadCache
from lookahead.errors import (
    FileFormatError,
    InternalError,
    InvalidInput,
    InvariantError,
    KVCacheError,
    LookaheadConfigError,
    LookaheadError,
    ModelLoadError,
    PersistError,
    RequestExists,
    SaveFileNotFound,
    ServerError,
    UnknownRequest,
    UnsupportedSGLangVersion,
    UserInputError,
)

__version__ = "0.1.0"

_ENGINE_NAMES = ("generate", "LookaheadGenerator", "GenerationResult", "GenerationStats")

__all__ = [
    "BatchDraft",
    "Draft",
    "FileFormatError",
    "InternalError",
    "InvalidInput",
    "InvariantError",
    "KVCacheError",
    "LookaheadCache",
    "LookaheadConfigError",
    "LookaheadError",
    "ModelLoadError",
    "PersistError",
    "RequestExists",
    "SaveFileNotFound",
    "ServerError",
    "UnknownRequest",
    "UnsupportedSGLangVersion",
    "UserInputError",
    "__version__",
    *_ENGINE_NAMES,
]


# Submodules reachable as attributes after a bare `import lookahead` (imported on first use).
_SUBMODULES = ("hf", "models", "kernels", "sizing")
# Modules that moved, refused with their new place for one release.
_MOVED = {
    "engine": "lookahead.hf",
    "sampling": "lookahead.hf.sampling",
    "kv": "lookahead.hf.kv",
    "recycling": "lookahead.hf.recycling",
    "bench": "the repository's benchmarks/ (python -m benchmarks NAME)",
}


def __getattr__(name: str):
    if name in _ENGINE_NAMES:
        from lookahead import hf

        return getattr(hf, name)
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f"lookahead.{name}")
    if name in _MOVED:
        raise AttributeError(f"lookahead.{name} moved: it is now {_MOVED[name]}")
    raise AttributeError(f"module 'lookahead' has no attribute {name!r}")
