"""Exceptions raised by `lookahead`: the Rust core maps each of its errors to one of the first
ones; the HF engine, the model loader, the SGLang plugin and the llama-server runner raise the
last five.

`LookaheadError` is the base of all of them; each also derives from the built-in exception
whose meaning fits, so `except ValueError` / `except KeyError` work as expected.
"""

from __future__ import annotations

__all__ = [
    "FileFormatError",
    "InternalError",
    "InvalidInput",
    "InvariantError",
    "KVCacheError",
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
]


class LookaheadError(Exception):
    """Base class of every error raised by lookahead."""


class InvalidInput(LookaheadError, ValueError):
    """A bad argument: token ids out of range, wrong dtype or shape, budget < 1, bad config."""


class UnknownRequest(LookaheadError, KeyError):
    """A request id that is not live: never started, or already finished."""

    def __str__(self) -> str:
        # KeyError would repr() the message; keep it readable.
        return str(self.args[0]) if self.args else ""


class RequestExists(LookaheadError, ValueError):
    """`start_request` with an id that is still live."""


class PersistError(LookaheadError, OSError):
    """An OS operation failed: reading or writing a save file, or starting the indexing
    threads."""


class SaveFileNotFound(PersistError, FileNotFoundError):
    """`LookaheadCache.load` of a path that does not exist."""


class FileFormatError(LookaheadError, ValueError):
    """A save file is not a lookahead save file, of another version, or damaged (its
    checksum, length or structure does not hold); the message names the file."""


class InternalError(LookaheadError, RuntimeError):
    """A bug in lookahead (a caught panic in the Rust core); please report it."""


class InvariantError(InternalError):
    """`check_invariants` found a broken structure."""


class UserInputError(LookaheadError, ValueError):
    """Input from outside refused by `lookahead.user_input`: a file that is not a regular
    file or is too long, JSON past its bounds; the message names the path or source."""


class ModelLoadError(LookaheadError, RuntimeError):
    """The model could not be fetched, converted or loaded."""


class KVCacheError(LookaheadError, TypeError):
    """The model does not expose the KV-cache API the HF engine needs."""


class LookaheadConfigError(LookaheadError, ValueError):
    """A bad SGLang plugin configuration, reported at server start-up."""


class UnsupportedSGLangVersion(LookaheadError, RuntimeError):
    """The installed SGLang is not one the plugin supports."""


class ServerError(LookaheadError, RuntimeError):
    """A `llama-server` (`lookahead.llamacpp.server`) exited or was not ready in time at
    start-up (the message ends with the end of its log), or refused a request."""
