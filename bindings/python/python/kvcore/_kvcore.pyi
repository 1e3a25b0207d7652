"""Type stubs of the extension module kvcore._kvcore (re-exported by kvcore)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Literal, Optional, Union, final, overload

import numpy as np
import numpy.typing as npt

__all__ = [
    "GenerationStats",
    "Model",
    "Sampler",
    "Session",
    "TextStream",
    "cores",
    "__version__",
    "_DEFAULT_SAMPLING",
]

__version__: str

_DEFAULT_SAMPLING: dict[str, float]

_TokenIds = Union[Sequence[int], npt.NDArray[np.integer]]
_Message = Union[Mapping[str, str], tuple[str, str]]
_StrPath = Union[str, os.PathLike[str]]
_Stop = Union[str, Sequence[str], None]
_FloatArray = npt.NDArray[np.float32]

def cores() -> int:
    """The number of cores this process may use (the rayon backend's default threads)."""

@final
class GenerationStats:
    """What one generation did."""

    @property
    def prompt_tokens(self) -> int: ...
    @property
    def reused_tokens(self) -> int:
        """Prompt positions the session already held and reused."""
    @property
    def prefilled_tokens(self) -> int:
        """Prompt positions run through the model."""
    @property
    def generated_tokens(self) -> int:
        """Tokens generated, a final stop token included."""
    @property
    def ttft_ms(self) -> float:
        """Time from the start of the prefill to the first generated token."""
    @property
    def prefill_ms(self) -> float: ...
    @property
    def decode_ms(self) -> float:
        """Wall time of the decode steps after the first token."""
    @property
    def prefill_tok_s(self) -> float: ...
    @property
    def decode_tok_s(self) -> float: ...
    @property
    def kv_bytes(self) -> int:
        """Bytes the KV cache held at the end."""
    @property
    def kv_capacity(self) -> int:
        """Positions the KV cache had room for at the end."""
    @property
    def finish_reason(self) -> Literal["stop", "length", "cancelled"]: ...
    @property
    def stop(self) -> Optional[str]:
        """The stop string that ended the generation, if one did."""
    @property
    def tokens(self) -> list[int]:
        """The generated ids, a final stop token included."""
    @property
    def backend(self) -> str: ...
    @property
    def threads(self) -> int: ...

@final
class Sampler:
    """The core's sampler chain (llama.cpp's order: logit bias, repetition penalties,
    top-k, top-p, min-p, temperature, a seeded draw). Its generator advances with every
    draw. temperature=0 is greedy."""

    def __new__(
        cls,
        temperature: float = 0.8,
        top_k: int = 40,
        top_p: float = 0.95,
        min_p: float = 0.05,
        repeat_penalty: float = 1.0,
        repeat_last_n: int = 64,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        seed: int = 0,
        *,
        logit_bias: Optional[Mapping[int, float]] = None,
    ) -> Sampler: ...
    @staticmethod
    def greedy() -> Sampler:
        """Greedy with every other stage off."""
    @property
    def is_greedy(self) -> bool: ...
    @property
    def temperature(self) -> float: ...
    @property
    def top_k(self) -> int: ...
    @property
    def top_p(self) -> float: ...
    @property
    def min_p(self) -> float: ...
    @property
    def repeat_penalty(self) -> float: ...
    @property
    def repeat_last_n(self) -> int:
        """-1: the whole context."""
    @property
    def presence_penalty(self) -> float: ...
    @property
    def frequency_penalty(self) -> float: ...
    @property
    def logit_bias(self) -> dict[int, float]: ...
    @property
    def seed(self) -> int: ...

@final
class TextStream(Iterator[str]):
    """The pieces of text of a generation running on a worker thread. close() (or
    leaving a ``with`` block, or dropping the iterator) cancels it and gives the session
    back."""

    def __iter__(self) -> TextStream: ...
    def __next__(self) -> str: ...
    def close(self) -> None: ...
    def __enter__(self) -> TextStream: ...
    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool: ...
    @property
    def stats(self) -> Optional[GenerationStats]:
        """The statistics once the generation has ended (None before)."""

@final
class Model:
    """A model loaded on a backend, with its tokenizer and chat template. Shared by any
    number of threads."""

    def __new__(
        cls,
        path_or_name: _StrPath,
        backend: Literal["scalar", "simd", "rayon"] = "rayon",
        threads: Optional[int] = None,
        kv_type: Literal["f32", "f16", "bf16", "q8_0", "q4_0"] = "f32",
        activations: Literal["f32", "q8"] = "f32",
        kv: Literal["grow", "dense"] = "grow",
        kernels: Optional[Literal["avx512", "avx2", "neon", "simd128", "scalar"]] = None,
    ) -> Model: ...
    def tokenize(self, text: str, add_bos: bool = True, parse_special: bool = False) -> list[int]: ...
    def detokenize(self, ids: _TokenIds) -> str: ...
    def chat_ids(self, messages: Sequence[_Message]) -> list[int]:
        """The ids of a conversation rendered by the chat template, ready for the reply."""
    @overload
    def generate(
        self,
        prompt: Union[str, _TokenIds],
        *,
        max_tokens: Optional[int] = 128,
        temperature: float = 0.8,
        top_k: int = 40,
        top_p: float = 0.95,
        min_p: float = 0.05,
        repeat_penalty: float = 1.0,
        repeat_last_n: int = 64,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        logit_bias: Optional[Mapping[int, float]] = None,
        seed: int = 0,
        stop: _Stop = None,
        stream: Literal[False] = False,
        session: Optional[Session] = None,
    ) -> str: ...
    @overload
    def generate(
        self,
        prompt: Union[str, _TokenIds],
        *,
        max_tokens: Optional[int] = 128,
        temperature: float = 0.8,
        top_k: int = 40,
        top_p: float = 0.95,
        min_p: float = 0.05,
        repeat_penalty: float = 1.0,
        repeat_last_n: int = 64,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        logit_bias: Optional[Mapping[int, float]] = None,
        seed: int = 0,
        stop: _Stop = None,
        stream: Literal[True],
        session: Optional[Session] = None,
    ) -> TextStream: ...
    @overload
    def chat(
        self,
        messages: Sequence[_Message],
        *,
        max_tokens: Optional[int] = 128,
        temperature: float = 0.8,
        top_k: int = 40,
        top_p: float = 0.95,
        min_p: float = 0.05,
        repeat_penalty: float = 1.0,
        repeat_last_n: int = 64,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        logit_bias: Optional[Mapping[int, float]] = None,
        seed: int = 0,
        stop: _Stop = None,
        stream: Literal[False] = False,
        session: Optional[Session] = None,
    ) -> str: ...
    @overload
    def chat(
        self,
        messages: Sequence[_Message],
        *,
        max_tokens: Optional[int] = 128,
        temperature: float = 0.8,
        top_k: int = 40,
        top_p: float = 0.95,
        min_p: float = 0.05,
        repeat_penalty: float = 1.0,
        repeat_last_n: int = 64,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        logit_bias: Optional[Mapping[int, float]] = None,
        seed: int = 0,
        stop: _Stop = None,
        stream: Literal[True],
        session: Optional[Session] = None,
    ) -> TextStream: ...
    def embed(self, text: str) -> _FloatArray:
        """Mean-pooled, L2-normalised final hidden state, float32 [embedding_length]."""
    @property
    def vocab_size(self) -> int: ...
    @property
    def context_length(self) -> int: ...
    @property
    def embedding_length(self) -> int: ...
    @property
    def backend(self) -> Literal["scalar", "simd", "rayon"]: ...
    @property
    def kernels(self) -> str:
        """The kernels that compute: "simd/avx512", "simd/avx2", ..., or "scalar"."""
    @property
    def threads(self) -> int: ...
    @property
    def path(self) -> Path: ...
    @property
    def has_chat_template(self) -> bool: ...

@final
class Session:
    """A sequence in a model's KV cache. One call at a time: a second concurrent call
    raises SessionBusyError."""

    def __new__(cls, model: Model, ctx: Optional[int] = None) -> Session: ...
    def prefill(self, ids: _TokenIds) -> _FloatArray:
        """Holds ids (reusing the prefix already held); the last position's logits."""
    def step(self, id: int) -> _FloatArray:
        """Appends one token; its logits."""
    def sample(self, sampler: Sampler) -> int:
        """The token sampler picks from the last logits; the session is unchanged."""
    @property
    def logits(self) -> Optional[_FloatArray]: ...
    def truncate(self, n: int) -> None: ...
    def fork(self) -> Session: ...
    def save(self, path: _StrPath) -> None: ...
    def restore(self, path: _StrPath) -> None: ...
    @classmethod
    def load(cls, path: _StrPath, model: Model, ctx: Optional[int] = None) -> Session: ...
    @property
    def tokens(self) -> list[int]: ...
    def __len__(self) -> int: ...
    @property
    def max_ctx(self) -> int: ...
    @property
    def kv_bytes(self) -> int: ...
    @property
    def model(self) -> Model: ...
    @property
    def last_stats(self) -> Optional[GenerationStats]: ...
