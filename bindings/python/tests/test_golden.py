"""The greedy continuations of the independent reference (shared/reference), through
the session API and through Model.generate."""

from __future__ import annotations

import numpy as np
import pytest

import kvcore
from conftest import GREEDY_MAX, IM_END, greedy_text

# Every listed logit of a correct float32 engine is within this of the reference
# (shared/reference/README.md).
LOGIT_TOLERANCE = 0.01


def test_reference_has_raw_and_chat_prompts(reference):
    assert any(e["chat"] for e in reference)
    assert any(not e["chat"] for e in reference)


def test_tokenize_raw_prompts(model, reference):
    for e in reference:
        if not e["chat"]:
            assert model.tokenize(e["text"]) == e["prompt_ids"], e["name"]


def test_tokenize_rendered_prompts(model, reference):
    for e in reference:
        ids = model.tokenize(e["rendered"], add_bos=False, parse_special=True)
        assert ids == e["prompt_ids"], e["name"]


def test_chat_template_renders_chat_prompts(model, reference):
    for e in reference:
        if e["chat"]:
            ids = model.chat_ids([{"role": "user", "content": e["text"]}])
            assert ids == e["prompt_ids"], e["name"]


def test_session_greedy_reproduces_reference(model, reference):
    greedy = kvcore.Sampler.greedy()
    for e in reference:
        session = kvcore.Session(model)
        logits = session.prefill(e["prompt_ids"])
        out: list[int] = []
        while True:
            pos = len(e["prompt_ids"]) + len(out) - 1
            for token, value in e["positions"][pos]["top"]:
                assert abs(float(logits[token]) - value) <= LOGIT_TOLERANCE, (
                    e["name"],
                    pos,
                    token,
                )
            token = session.sample(greedy)
            assert token == int(np.argmax(logits))
            out.append(token)
            if token == IM_END or len(out) == GREEDY_MAX:
                break
            logits = session.step(token)
        assert out == e["greedy_ids"], e["name"]
        assert session.tokens == e["prompt_ids"] + out[:-1]


@pytest.mark.parametrize("temperature", [0, 0.0])
def test_generate_greedy_text(model, reference, temperature):
    for e in reference:
        session = kvcore.Session(model)
        text = model.generate(
            e["prompt_ids"],
            max_tokens=len(e["greedy_ids"]),
            temperature=temperature,
            session=session,
        )
        assert text == greedy_text(model, e["greedy_ids"]), e["name"]
        assert text == e["greedy_text"], e["name"]
        stats = session.last_stats
        assert stats.tokens == e["greedy_ids"]
        ended_at_stop = e["greedy_ids"][-1] == IM_END
        assert stats.finish_reason == ("stop" if ended_at_stop else "length")


def test_generate_from_text_and_chat(model, reference):
    for e in reference:
        if e["chat"]:
            reply = model.chat(
                [{"role": "user", "content": e["text"]}], max_tokens=GREEDY_MAX, temperature=0
            )
            assert reply == greedy_text(model, e["greedy_ids"]), e["name"]
            # (role, content) tuples are the same conversation.
            assert model.chat([("user", e["text"])], max_tokens=GREEDY_MAX, temperature=0) == reply
        else:
            text = model.generate(e["text"], max_tokens=GREEDY_MAX, temperature=0)
            assert text == greedy_text(model, e["greedy_ids"]), e["name"]


def test_stop_string_ends_the_text(model, reference):
    e = next(e for e in reference if e["name"] == "raw-france")
    session = kvcore.Session(model)
    text = model.generate(e["text"], max_tokens=GREEDY_MAX, temperature=0, stop="\n", session=session)
    assert text == e["greedy_text"].split("\n")[0]
    assert session.last_stats.finish_reason == "stop"
    assert session.last_stats.stop == "\n"
