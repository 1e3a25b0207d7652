"""stream=True: the same text, cancellation, and the session given back."""

from __future__ import annotations

import pytest

import kvcore

PROMPT = "The capital of France is"


def test_stream_joins_to_the_text(model):
    text = model.generate(PROMPT, max_tokens=24, temperature=0)
    stream = model.generate(PROMPT, max_tokens=24, temperature=0, stream=True)
    assert isinstance(stream, kvcore.TextStream)
    pieces = list(stream)
    assert len(pieces) > 1
    assert "".join(pieces) == text
    assert stream.stats is not None and stream.stats.finish_reason == "length"
    assert list(stream) == []  # finished: stays finished


def test_chat_stream(model):
    messages = [{"role": "user", "content": "Hello"}]
    reply = model.chat(messages, max_tokens=24, temperature=0)
    assert "".join(model.chat(messages, max_tokens=24, temperature=0, stream=True)) == reply


def test_break_cancels_and_gives_the_session_back(model):
    session = kvcore.Session(model)
    for i, _ in enumerate(
        model.generate(PROMPT, max_tokens=100, temperature=0, stream=True, session=session)
    ):
        if i == 2:
            break
    # The iterator is gone: the generation was cancelled and the session is back.
    stats = session.last_stats
    assert stats.finish_reason == "cancelled"
    assert stats.generated_tokens < 100
    assert len(session) == stats.prompt_tokens + stats.generated_tokens - 1

    # The same session serves the next generation, reusing the prompt.
    text = model.generate(PROMPT, max_tokens=8, temperature=0, session=session)
    assert text == model.generate(PROMPT, max_tokens=8, temperature=0)
    assert session.last_stats.reused_tokens > 0


def test_session_is_busy_until_the_stream_ends(model):
    session = kvcore.Session(model)
    stream = model.generate(PROMPT, max_tokens=100, temperature=0, stream=True, session=session)
    next(stream)
    with pytest.raises(kvcore.SessionBusyError):
        len(session)
    with pytest.raises(kvcore.SessionBusyError):
        model.generate(PROMPT, session=session)
    stream.close()
    stream.close()  # idempotent
    assert len(session) > 0
    assert session.last_stats.finish_reason == "cancelled"
    with pytest.raises(StopIteration):
        next(stream)


def test_context_manager_closes(model):
    session = kvcore.Session(model)
    with model.generate(PROMPT, max_tokens=100, stream=True, session=session) as stream:
        next(stream)
    assert stream.stats.finish_reason == "cancelled"
    session.prefill(model.tokenize(PROMPT))


def test_exhausted_stream_gives_the_session_back(model):
    session = kvcore.Session(model)
    stream = model.generate(PROMPT, max_tokens=6, temperature=0, stream=True, session=session)
    text = "".join(stream)
    # No close() needed: the end of the stream returned the session.
    assert session.last_stats.generated_tokens == 6
    assert session.last_stats.finish_reason == "length"
    assert model.detokenize(session.last_stats.tokens) == text


def test_errors_surface_from_next(model):
    session = kvcore.Session(model, ctx=8)
    stream = model.generate(list(range(100, 120)), stream=True, session=session)
    with pytest.raises(kvcore.ContextOverflowError, match="longer than the context"):
        next(stream)
    # The failed generation left the session as it was, and gave it back.
    assert len(session) == 0


def test_bad_sampling_raises_at_the_call(model):
    with pytest.raises(kvcore.InvalidArgumentError, match="temperature"):
        model.generate(PROMPT, temperature=-1, stream=True)
