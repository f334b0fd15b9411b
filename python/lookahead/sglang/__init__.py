"""SGLang plugin: `--speculative-algorithm LOOKAHEAD`, installed with the wheel, no fork.

SGLang finds `register` through the entry point `lookahead = "lookahead.sglang:register"`
(group `sglang.srt.plugins`) and calls it from `sglang.srt.plugins.load_plugins()` in the
launcher and in every scheduler process. Importing this package does not import SGLang;
`register` does, after checking its version.

Supported: SGLang 0.5.23 exactly (the worker subclasses SGLang's `NGRAMWorker`, whose
internals change between releases). Other versions are refused with a message naming the
version; `LOOKAHEAD_SGLANG_SKIP_VERSION_CHECK=1` loads anyway, at the user's risk.
Configuration: `lookahead.sglang.config` (SGLang's `--speculative-*` flags plus the
`LOOKAHEAD_CONFIG` JSON environment variable).
"""

from __future__ import annotations

import logging
from importlib import metadata

from lookahead.errors import UnsupportedSGLangVersion
from lookahead.sglang.config import SKIP_VERSION_CHECK_ENV, LookaheadConfigError, read_env

__all__ = [
    "SUPPORTED_SGLANG_VERSIONS",
    "LookaheadConfigError",
    "UnsupportedSGLangVersion",
    "check_sglang_version",
    "register",
]

SUPPORTED_SGLANG_VERSIONS = ("0.5.23",)

logger = logging.getLogger(__name__)

_registered = False


def check_sglang_version(installed: str | None = None, skip: bool = False) -> str:
    """Returns the installed SGLang version, or raises `UnsupportedSGLangVersion` if it is
    missing or not in `SUPPORTED_SGLANG_VERSIONS` (unless `skip`)."""
    if installed is None:
        try:
            installed = metadata.version("sglang")
        except metadata.PackageNotFoundError:
            raise UnsupportedSGLangVersion(
                "lookahead's SGLang plugin needs sglang installed "
                f"(supported: {', '.join(SUPPORTED_SGLANG_VERSIONS)})"
            ) from None
    if installed in SUPPORTED_SGLANG_VERSIONS:
        return installed
    if skip:
        logger.warning(
            "lookahead: sglang %s is not a supported version (%s); loading anyway because "
            "%s is set",
            installed,
            ", ".join(SUPPORTED_SGLANG_VERSIONS),
            SKIP_VERSION_CHECK_ENV,
        )
        return installed
    raise UnsupportedSGLangVersion(
        f"lookahead's SGLang plugin supports sglang {', '.join(SUPPORTED_SGLANG_VERSIONS)}, "
        f"but sglang {installed} is installed: install sglang=="
        f"{SUPPORTED_SGLANG_VERSIONS[-1]}, or set {SKIP_VERSION_CHECK_ENV}=1 to load anyway "
        "(unsupported)"
    )


def register() -> None:
    """SGLang plugin entry point: registers `LOOKAHEAD`, the `lora_compat`, `corpus_*`
    endpoint and `request_control` patches and the CPU tree-attention backend (`lookahead.sglang.cpu_attention`).

    Idempotent within a process. Raises `UnsupportedSGLangVersion` on an unsupported SGLang
    (SGLang's `load_plugins` logs it and starts without `LOOKAHEAD`).
    """
    global _registered
    if _registered:
        logger.debug("lookahead: SGLang plugin already registered in this process")
        return
    env = read_env()
    version = check_sglang_version(skip=env.skip_version_check)
    from lookahead.sglang import patches
    from lookahead.sglang.algo import register_algorithm
    from lookahead.sglang.cpu_attention import register_backend

    register_algorithm()
    register_backend()
    patches.register_patch("lora_compat")
    for name in ("corpus_add", "corpus_remove", "corpus_list", "request_control"):
        patches.register_patch(name)
    _registered = True
    logger.info("lookahead: SGLang plugin registered (sglang %s)", version)
