"""Shared fixtures: the model (loaded once) and the independent reference data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import kvcore

# The reference data lives next to the repository: <repo>/../shared/reference.
REPO = Path(__file__).resolve().parents[3]
REFERENCE = REPO / ".." / "shared" / "reference" / "smollm2-135m-instruct-q4_1"

# SmolLM2's <|im_end|>: the end of a turn, where the reference's greedy runs stop.
IM_END = 2
# The reference's greedy runs stop after this many tokens.
GREEDY_MAX = 24


@pytest.fixture(scope="session")
def model() -> kvcore.Model:
    """SmolLM2-135M-Instruct on the default (rayon) backend, resolved through the
    engine's fetch path (the user cache)."""
    return kvcore.Model("smollm2")


@pytest.fixture(scope="session")
def reference() -> list[dict]:
    """The prompts of logits.json. Missing data is a failure, not a skip."""
    path = REFERENCE / "logits.json"
    if not path.is_file():
        pytest.fail(f"the reference data is missing: {path}")
    with open(path, encoding="utf-8") as f:
        entries = json.load(f)
    assert entries, f"{path} holds no prompts"
    return entries


def greedy_text(model: kvcore.Model, greedy_ids: list[int]) -> str:
    """The text of a reference continuation, its final stop token left out."""
    ids = greedy_ids[:-1] if greedy_ids and greedy_ids[-1] == IM_END else greedy_ids
    return model.detokenize(ids)
