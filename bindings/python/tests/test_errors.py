"""Errors are exceptions of the engine's kinds, with its messages; no input panics."""

from __future__ import annotations

import pytest

import kvcore


def test_exception_hierarchy():
    for cls in (
        kvcore.InvalidArgumentError,
        kvcore.IoError,
        kvcore.ModelFileError,
        kvcore.ContextOverflowError,
        kvcore.SessionFileError,
        kvcore.KvCacheError,
        kvcore.TokenizerError,
        kvcore.FetchError,
        kvcore.SessionBusyError,
    ):
        assert issubclass(cls, kvcore.KvcoreError)
        assert cls.__module__ == "kvcore"
        assert isinstance(cls.kind, str)
    assert issubclass(kvcore.KvcoreError, Exception)
    assert issubclass(kvcore.InvalidArgumentError, ValueError)
    assert issubclass(kvcore.IoError, OSError)
    assert issubclass(kvcore.SessionBusyError, RuntimeError)


def test_unknown_backend():
    with pytest.raises(kvcore.InvalidArgumentError, match='"cuda"') as info:
        kvcore.Model("smollm2", backend="cuda")
    assert isinstance(info.value, ValueError)
    assert "scalar, simd, rayon" in str(info.value)


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"threads": 0}, "threads"),
        ({"threads": -2}, "threads"),
        ({"backend": "simd", "threads": 2}, "one thread"),
        ({"kv_type": "q9"}, '"q9"'),
        ({"activations": "f16"}, '"f16"'),
        ({"kv": "sparse"}, '"sparse"'),
        ({"kernels": "avx"}, 'unknown kernels "avx"'),
        ({"backend": "scalar", "kernels": "avx2"}, "no avx2 kernels"),
    ],
)
def test_bad_model_options(kwargs, needle):
    with pytest.raises(kvcore.InvalidArgumentError, match=needle):
        kvcore.Model("smollm2", **kwargs)


def test_missing_model_file(tmp_path):
    missing = tmp_path / "no-such-model.gguf"
    with pytest.raises((kvcore.ModelFileError, kvcore.IoError)) as info:
        kvcore.Model(missing)
    assert str(missing) in str(info.value)
    assert isinstance(info.value, kvcore.IoError) and isinstance(info.value, OSError)
    assert "No such file" in str(info.value)  # the OS's reason is in the message


def test_not_a_model_file(tmp_path):
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(kvcore.ModelFileError, match="bogus.gguf"):
        kvcore.Model(str(bogus))
    with pytest.raises(kvcore.ModelFileError, match="not a regular file"):
        kvcore.Model(tmp_path)


def test_prompt_longer_than_the_context(model):
    session = kvcore.Session(model, ctx=8)
    ids = list(range(100, 110))
    with pytest.raises(kvcore.ContextOverflowError, match="10 tokens") as info:
        model.generate(ids, session=session)
    assert "8 positions" in str(info.value)
    with pytest.raises(kvcore.ContextOverflowError):
        session.prefill(ids)
    assert len(session) == 0


@pytest.mark.parametrize("bad", ["vocab", -1, 2**40])
def test_token_outside_the_vocabulary(model, bad):
    token = model.vocab_size if bad == "vocab" else bad
    session = kvcore.Session(model)
    with pytest.raises(kvcore.InvalidArgumentError, match=str(token)):
        session.prefill([1, 2, token])
    with pytest.raises(kvcore.InvalidArgumentError, match=str(token)):
        session.step(token)
    with pytest.raises(kvcore.InvalidArgumentError):
        model.generate([token])
    assert len(session) == 0


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"temperature": -1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0}, "top-p"),
        ({"min_p": 2}, "min-p"),
        ({"repeat_penalty": 0}, "repeat-penalty"),
        ({"top_k": -1}, "top_k"),
        ({"repeat_last_n": -2}, "repeat_last_n"),
        ({"seed": -1}, "seed"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"logit_bias": {-5: 1.0}}, "-5"),
    ],
)
def test_bad_sampling(model, kwargs, needle):
    with pytest.raises(kvcore.InvalidArgumentError, match=needle):
        model.generate("Hi", **kwargs)
    if "max_tokens" not in kwargs:
        with pytest.raises(kvcore.InvalidArgumentError, match=needle):
            kvcore.Sampler(**kwargs)


def test_logit_bias_outside_the_vocabulary(model):
    with pytest.raises(kvcore.InvalidArgumentError, match="logit-bias"):
        model.generate("Hi", logit_bias={model.vocab_size: 1.0}, max_tokens=2)


def test_sample_before_prefill(model):
    with pytest.raises(kvcore.InvalidArgumentError, match="prefill"):
        kvcore.Session(model).sample(kvcore.Sampler())


def test_bad_session_arguments(model, tmp_path):
    for ctx in (0, -1, model.context_length + 1):
        with pytest.raises(kvcore.InvalidArgumentError):
            kvcore.Session(model, ctx=ctx)
    session = kvcore.Session(model)
    with pytest.raises(kvcore.InvalidArgumentError, match="empty"):
        session.prefill([])
    with pytest.raises(kvcore.InvalidArgumentError):
        session.truncate(-1)
    with pytest.raises(kvcore.IoError, match="no-such-dir"):
        session.save(tmp_path / "no-such-dir" / "s.kvsession")
    with pytest.raises(kvcore.IoError):
        kvcore.Session.load(tmp_path / "missing.kvsession", model)


def test_session_of_another_model(model):
    other = kvcore.Model("smollm2", backend="scalar")
    with pytest.raises(kvcore.InvalidArgumentError, match="another model"):
        model.generate("Hi", session=kvcore.Session(other))


def test_empty_inputs(model):
    with pytest.raises(kvcore.InvalidArgumentError):
        model.generate("")
    with pytest.raises(kvcore.InvalidArgumentError):
        model.generate([])
    with pytest.raises(kvcore.InvalidArgumentError):
        model.embed("")
    assert model.detokenize([]) == ""
    assert model.tokenize("", add_bos=False) == []
    assert model.generate("Hi", max_tokens=0) == ""


def test_detokenize_outside_the_vocabulary(model):
    with pytest.raises(kvcore.InvalidArgumentError, match="outside the vocabulary"):
        model.detokenize([1, model.vocab_size + 7])


def test_wrong_types_are_type_errors(model):
    session = kvcore.Session(model)
    with pytest.raises(TypeError):
        session.prefill("The capital")
    with pytest.raises(TypeError):
        session.prefill([1.5])
    with pytest.raises(TypeError):
        session.prefill(None)
    with pytest.raises(TypeError):
        model.generate(3.5)
    with pytest.raises(TypeError):
        model.generate("Hi", stop=5)
    with pytest.raises(TypeError):
        model.generate("Hi", session="not a session")
    with pytest.raises(TypeError):
        model.generate("Hi", no_such_keyword=1)
    with pytest.raises(TypeError):
        model.chat("Hello")
    with pytest.raises(TypeError):
        model.chat({"role": "user", "content": "Hello"})
    with pytest.raises(TypeError):
        model.chat([("user",)])
    with pytest.raises(TypeError):
        model.chat([("user", 3)])
    with pytest.raises(ValueError):
        model.chat([{"role": "user"}])
    with pytest.raises(TypeError):
        model.tokenize(b"bytes")
    with pytest.raises(TypeError):
        session.sample("greedy")
    with pytest.raises(TypeError):
        kvcore.Session("smollm2")
    with pytest.raises(TypeError):
        kvcore.Model(42)
