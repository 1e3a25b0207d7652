"""The rest of the API: properties, logits and embeddings as NumPy arrays, samplers."""

from __future__ import annotations

import inspect
import math
import sys
from pathlib import Path

import numpy as np
import pytest

import kvcore

SAMPLING = kvcore._kvcore._DEFAULT_SAMPLING


def test_keyword_defaults_are_the_engines():
    """The defaults in the signatures are SamplerParams::default()."""
    for fn in (kvcore.Sampler, kvcore.Model.generate, kvcore.Model.chat):
        if isinstance(fn, type) and sys.version_info < (3, 10):
            continue  # abi3 gives classes a __text_signature__ from CPython 3.10 on
        params = inspect.signature(fn).parameters
        for name, value in SAMPLING.items():
            default = params[name].default
            assert np.float32(default) == np.float32(value), (fn, name)
    gen = inspect.signature(kvcore.Model.generate).parameters
    assert gen["max_tokens"].default == 128
    assert gen["stream"].default is False and gen["session"].default is None
    sampler = kvcore.Sampler()
    for name, value in SAMPLING.items():
        assert np.float32(getattr(sampler, name)) == np.float32(value), name


def test_model_properties(model):
    assert model.vocab_size == 49152
    assert model.context_length == 8192
    assert model.embedding_length == 576
    assert model.backend == "rayon"
    assert model.kernels.startswith("simd/")
    assert model.threads == kvcore.cores()
    assert isinstance(model.path, Path) and model.path.is_file()
    assert model.path.suffix == ".gguf"
    assert model.has_chat_template
    assert "rayon" in repr(model)
    assert isinstance(kvcore.__version__, str)


def test_logits_are_float32_vocab_rows(model):
    session = kvcore.Session(model)
    logits = session.prefill(model.tokenize("The capital of France is"))
    assert isinstance(logits, np.ndarray)
    assert logits.dtype == np.float32 and logits.shape == (model.vocab_size,)
    assert np.isfinite(logits).all()
    # NumPy does not own the buffer: it is a Rust Vec, kept alive by the array's base.
    assert not logits.flags.owndata
    assert logits.base is not None and type(logits.base).__name__ == "PySliceContainer"
    assert logits.flags.writeable and logits.flags.c_contiguous
    # Each read of .logits is a new array (a copy of the engine's row).
    held = session.logits
    assert np.array_equal(held, logits) and held is not logits
    held[:] = 0
    assert np.array_equal(session.logits, logits)

    step = session.step(int(np.argmax(logits)))
    assert step.dtype == np.float32 and step.shape == (model.vocab_size,)
    assert not step.flags.owndata


def test_embed(model):
    e = model.embed("The capital of France is Paris.")
    assert e.dtype == np.float32 and e.shape == (model.embedding_length,)
    assert not e.flags.owndata  # the engine's Vec, handed over without a copy
    assert math.isclose(float(np.linalg.norm(e)), 1.0, rel_tol=1e-4)
    same = model.embed("The capital of France is Paris.")
    assert np.array_equal(e, same)
    near = model.embed("Paris is the capital of France.")
    far = model.embed("def fibonacci(n):")
    assert float(e @ near) > float(e @ far)


def test_tokenize_round_trip(model):
    text = "Hello, world! <|im_start|> café 🦀"
    ids = model.tokenize(text, add_bos=False)
    assert all(isinstance(i, int) for i in ids)
    assert model.detokenize(ids) == text
    # Special-token text is literal unless parse_special.
    assert 1 not in ids
    assert 1 in model.tokenize("<|im_start|>", add_bos=False, parse_special=True)
    assert model.detokenize(np.array(ids, dtype=np.int64)) == text


def test_sampler(model):
    s = kvcore.Sampler(temperature=0.7, top_k=20, seed=42, logit_bias={5: -1.0})
    assert s.temperature == pytest.approx(0.7) and s.top_k == 20 and s.seed == 42
    assert s.logit_bias == {5: -1.0}
    assert not s.is_greedy
    assert kvcore.Sampler.greedy().is_greedy and kvcore.Sampler(0).is_greedy
    assert kvcore.Sampler(repeat_last_n=-1).repeat_last_n == -1
    assert "temperature=0.7" in repr(s)

    session = kvcore.Session(model)
    session.prefill(model.tokenize("Once upon a time"))
    a = kvcore.Sampler(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7)
    b = kvcore.Sampler(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7)
    draws_a = [session.sample(a) for _ in range(20)]
    draws_b = [session.sample(b) for _ in range(20)]
    assert draws_a == draws_b  # same seed, same draws
    assert len(set(draws_a)) > 1  # the generator advances
    assert all(0 <= t < model.vocab_size for t in draws_a)
    # sample() leaves the session as it was.
    assert len(session) == len(model.tokenize("Once upon a time"))


def test_seeded_generation_is_reproducible(model):
    kwargs = dict(max_tokens=16, temperature=0.9, seed=1234)
    a = model.generate("Once upon a time", **kwargs)
    b = model.generate("Once upon a time", **kwargs)
    assert a == b


def test_generation_stats(model):
    session = kvcore.Session(model)
    text = model.generate("The capital of France is", max_tokens=5, temperature=0, session=session)
    st = session.last_stats
    assert isinstance(st, kvcore.GenerationStats)
    assert st.prompt_tokens == 5 and st.reused_tokens == 0 and st.prefilled_tokens == 5
    assert st.generated_tokens == 5 == len(st.tokens)
    assert model.detokenize(st.tokens) == text
    assert st.ttft_ms > 0 and st.prefill_tok_s > 0 and st.decode_tok_s > 0
    assert st.prefill_ms > 0 and st.decode_ms > 0
    assert st.kv_bytes > 0 and st.kv_capacity >= 9
    assert st.backend == "rayon" and st.threads == model.threads
    assert st.finish_reason == "length" and st.stop is None
    assert "finish_reason" in repr(st)


def test_max_tokens_none_runs_to_the_stop(model):
    session = kvcore.Session(model)
    reply = model.chat([("user", "Hello")], max_tokens=None, temperature=0, session=session)
    assert reply
    assert session.last_stats.finish_reason == "stop"
    assert session.last_stats.tokens[-1] == 2


def test_generation_ends_at_the_context(model):
    session = kvcore.Session(model, ctx=8)
    model.generate(list(range(100, 105)), max_tokens=None, temperature=0, session=session)
    st = session.last_stats
    # 3 positions left plus the last token, which is never run.
    assert st.generated_tokens <= 4
    assert len(session) <= 8
