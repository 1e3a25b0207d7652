"""The official `openai` Python client against a running `kvcore serve` (SmolLM2).

Usage: python openai_client.py BASE_URL REFERENCE_LOGITS_JSON

Chat and text completions, whole and streamed (the streamed text must equal the whole
one), usage, stop strings, the model list, and errors the client raises as
`openai.BadRequestError`. The greedy text of the reference prompt "The capital of France
is" comes from `../shared/reference` (an independent float64 implementation).
"""

import json
import sys

import openai

base, reference_path = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)

models = client.models.list()
model = models.data[0].id
assert model, models

# Text completion, greedy, on the reference prompt: the reference's continuation.
with open(reference_path) as f:
    cases = {c["name"]: c for c in json.load(f)}
france = cases["raw-france"]
n = len(france["greedy_ids"])
whole = client.completions.create(model=model, prompt=france["text"], max_tokens=n, temperature=0)
assert whole.object == "text_completion", whole
assert whole.choices[0].text == france["greedy_text"], (whole.choices[0].text, france["greedy_text"])
assert whole.choices[0].finish_reason == "length", whole
assert whole.usage.prompt_tokens == len(france["prompt_ids"]), whole.usage
assert whole.usage.completion_tokens == n, whole.usage

streamed = client.completions.create(
    model=model, prompt=france["text"], max_tokens=n, temperature=0, stream=True
)
text = "".join(chunk.choices[0].text for chunk in streamed if chunk.choices)
assert text == whole.choices[0].text, (text, whole.choices[0].text)

# A stop string ends the text before it, and is not part of it.
stopped = client.completions.create(
    model=model, prompt=france["text"], max_tokens=n, temperature=0, stop=["\n"]
)
assert stopped.choices[0].text == france["greedy_text"].split("\n")[0], stopped
assert stopped.choices[0].finish_reason == "stop", stopped

# Chat, whole and streamed with usage.
messages = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]
chat = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=24)
reply = chat.choices[0].message
assert reply.role == "assistant", chat
assert "Paris" in reply.content, reply.content
assert chat.choices[0].finish_reason in ("stop", "length"), chat
stream = client.chat.completions.create(
    model=model,
    messages=messages,
    temperature=0,
    max_tokens=24,
    stream=True,
    stream_options={"include_usage": True},
)
chunks = list(stream)
text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
assert text == reply.content, (text, reply.content)
assert chunks[-1].usage.prompt_tokens == chat.usage.prompt_tokens, chunks[-1]
assert chunks[-1].usage.completion_tokens == chat.usage.completion_tokens, chunks[-1]

# Sampling with a seed repeats itself.
a, b = (
    client.chat.completions.create(
        model=model, messages=messages, temperature=0.9, top_p=0.95, seed=42, max_tokens=16
    ).choices[0].message.content
    for _ in range(2)
)
assert a == b, (a, b)

# Errors: the client raises BadRequestError with the server's message.
for kwargs, needle in [
    ({"max_tokens": 100000}, "max_tokens"),
    ({"temperature": 5}, "temperature"),
    ({"n": 3}, "n must be 1"),
]:
    try:
        client.chat.completions.create(model=model, messages=messages, **kwargs)
    except openai.BadRequestError as e:
        assert e.status_code == 400 and needle in e.message, (e.status_code, e.message)
    else:
        raise AssertionError(f"{kwargs} was accepted")

print("openai client test: ok (openai", openai.__version__ + ")")
