"""Sessions: prefix reuse across chat turns, fork, truncate, save and load."""

from __future__ import annotations

import numpy as np
import pytest

import kvcore

PROMPT = "The capital of France is"


def test_two_turn_chat_reuses_the_first_turn(model):
    session = kvcore.Session(model)
    conversation = [{"role": "user", "content": "What is the capital of France?"}]
    first = model.chat(conversation, max_tokens=48, temperature=0, session=session)
    assert first
    first_prompt = session.last_stats.prompt_tokens

    conversation += [
        {"role": "assistant", "content": first},
        {"role": "user", "content": "And what is the capital of Italy?"},
    ]
    second = model.chat(conversation, max_tokens=48, temperature=0, session=session)
    stats = session.last_stats
    assert stats.reused_tokens >= first_prompt > 0
    assert stats.prefilled_tokens < stats.prompt_tokens
    assert stats.reused_tokens + stats.prefilled_tokens == stats.prompt_tokens

    # The same conversation in a fresh session gives the same greedy reply.
    fresh = kvcore.Session(model)
    assert model.chat(conversation, max_tokens=48, temperature=0, session=fresh) == second
    assert fresh.last_stats.reused_tokens == 0


def test_prefill_reuses_a_held_prefix(model):
    ids = model.tokenize(PROMPT)
    session = kvcore.Session(model)
    session.prefill(ids[:3])
    logits = session.prefill(ids)
    full = kvcore.Session(model).prefill(ids)
    # Same argmax and close logits; reuse only skips the first three positions.
    assert int(np.argmax(logits)) == int(np.argmax(full))
    np.testing.assert_allclose(logits, full, atol=1e-3)


def test_fork_is_independent(model):
    ids = model.tokenize(PROMPT)
    session = kvcore.Session(model)
    logits = session.prefill(ids)
    fork = session.fork()
    assert fork.tokens == session.tokens == ids
    assert np.array_equal(fork.logits, logits)
    assert fork.model is session.model

    token = int(np.argmax(logits))
    a = session.step(token)
    b = fork.step(token)
    assert np.array_equal(a, b)
    fork.step(int(np.argmax(b)))
    assert len(fork) == len(session) + 1
    assert session.tokens == ids + [token]


def test_truncate_rewinds(model):
    ids = model.tokenize(PROMPT)
    session = kvcore.Session(model)
    logits = session.prefill(ids)
    token = int(np.argmax(logits))
    after = session.step(token)
    session.step(int(np.argmax(after)))
    assert len(session) == len(ids) + 2

    session.truncate(len(ids))
    assert session.tokens == ids
    assert session.logits is None
    # The same step at the same position gives the same logits.
    assert np.array_equal(session.step(token), after)

    session.truncate(10_000)  # longer than the session: nothing to drop
    assert len(session) == len(ids) + 1
    session.truncate(0)
    assert len(session) == 0 and session.tokens == []


def test_save_load_round_trip(model, tmp_path):
    ids = model.tokenize(PROMPT)
    session = kvcore.Session(model)
    logits = session.prefill(ids)
    path = tmp_path / "france.kvsession"
    session.save(path)
    assert path.stat().st_size > 0

    loaded = kvcore.Session.load(path, model)
    assert loaded.tokens == ids
    assert loaded.logits is None
    assert loaded.max_ctx == model.context_length
    token = int(np.argmax(logits))
    a = session.step(token)
    b = loaded.step(token)
    assert a.dtype == b.dtype == np.float32
    assert np.array_equal(a, b)  # bitwise

    # A smaller context, and str paths, work too.
    small = kvcore.Session.load(str(path), model, ctx=64)
    assert small.max_ctx == 64 and small.tokens == ids


def test_restore_replaces_positions(model, tmp_path):
    ids = model.tokenize(PROMPT)
    source = kvcore.Session(model)
    source.prefill(ids)
    path = tmp_path / "s.kvsession"
    source.save(path)

    target = kvcore.Session(model)
    target.prefill(model.tokenize("Hello there"))
    target.restore(path)
    assert target.tokens == ids


@pytest.mark.parametrize("corruption", ["flip-payload", "truncate", "bad-magic"])
def test_corrupt_session_file(model, tmp_path, corruption):
    ids = model.tokenize(PROMPT)
    original = kvcore.Session(model)
    logits = original.prefill(ids)
    path = tmp_path / "s.kvsession"
    original.save(path)
    data = bytearray(path.read_bytes())
    if corruption == "flip-payload":
        data[len(data) // 2] ^= 0xFF
    elif corruption == "truncate":
        data = data[: len(data) - 100]
    else:
        data[0] ^= 0xFF
    bad = tmp_path / "bad.kvsession"
    bad.write_bytes(bytes(data))

    with pytest.raises(kvcore.SessionFileError):
        kvcore.Session.load(bad, model)

    other = model.tokenize("Hello there")
    target = kvcore.Session(model)
    target_logits = target.prefill(other)
    with pytest.raises(kvcore.SessionFileError) as info:
        target.restore(bad)
    assert "session file" in str(info.value)
    # The failed restore left the target as it was.
    assert target.tokens == other
    assert np.array_equal(target.logits, target_logits)

    # The original session is untouched and still runs.
    assert original.tokens == ids
    assert np.array_equal(original.logits, logits)
    original.step(int(np.argmax(logits)))
    assert len(original) == len(ids) + 1


def test_session_properties(model):
    session = kvcore.Session(model, ctx=256)
    assert session.max_ctx == 256
    assert len(session) == 0 and session.tokens == [] and session.logits is None
    assert session.last_stats is None
    assert session.model is model
    session.prefill(model.tokenize(PROMPT))
    assert session.kv_bytes > 0
    assert "len=5" in repr(session)
    # The growing store grows with the sequence.
    long = kvcore.Session(model, ctx=1024)
    long.prefill(list(range(100, 900)))
    assert long.kv_bytes > session.kv_bytes


def test_quantized_kv_types(model, tmp_path):
    """A q8_0 cache holds 34/128 of the f32 bytes, generates, and its state file loads
    only into a model of the same KV type (the file records the types)."""
    q8 = kvcore.Model("smollm2", kv_type="q8_0")
    ids = q8.tokenize(PROMPT)
    a, b = kvcore.Session(model), kvcore.Session(q8)
    la, lb = a.prefill(ids), b.prefill(ids)
    assert b.kv_bytes * 128 == a.kv_bytes * 34
    assert int(np.argmax(la)) == int(np.argmax(lb))
    path = tmp_path / "q8.kvsession"
    b.save(path)
    loaded = kvcore.Session.load(path, q8)
    token = int(np.argmax(lb))
    assert np.array_equal(b.step(token), loaded.step(token))  # bitwise
    with pytest.raises(kvcore.SessionFileError, match="q8_0"):
        kvcore.Session.load(path, model)
