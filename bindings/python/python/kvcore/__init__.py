"""kvcore: CPU transformer inference.

>>> import kvcore
>>> model = kvcore.Model("smollm2")
>>> model.generate("The capital of France is", max_tokens=2, temperature=0)
' Paris.'

See ``docs/python.md`` in the kvcore repository for the whole API.
"""

from . import _errors
from ._errors import (
    ContextOverflowError,
    FetchError,
    InvalidArgumentError,
    IoError,
    KvCacheError,
    KvcoreError,
    ModelFileError,
    SessionBusyError,
    SessionFileError,
    TokenizerError,
)
from ._kvcore import (
    GenerationStats,
    Model,
    Sampler,
    Session,
    TextStream,
    __version__,
    cores,
)

__all__ = [
    "Model",
    "Session",
    "Sampler",
    "TextStream",
    "GenerationStats",
    "cores",
    "__version__",
]
__all__ += _errors.__all__
