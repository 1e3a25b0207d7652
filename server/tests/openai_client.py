"""The official `openai` Python client against a running `kvcore serve` (SmolLM2).

Usage: python openai_client.py BASE_URL REFERENCE_LOGITS_JSON KEYED_URL KEY

Chat and text completions, whole and streamed (the streamed text must equal the whole
one), usage, stop strings, the model list, embeddings, log-probabilities (the top one is the greedy
token; the top's probabilities sum to at most 1), errors the client raises as
`openai.BadRequestError` (among them a 400 for each refused field, naming it), and a
second server, started with KEY, answering 401 (`openai.AuthenticationError`) without
it. The greedy text of the reference prompt "The capital of France
is" comes from `../shared/reference` (an independent float64 implementation).
"""

import json
import math
import sys
import urllib.request

import openai

base, reference_path, keyed_base, key = sys.argv[1:5]
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

# Log-probabilities, chat: the greedy token is the top one, its bytes rebuild the text,
# and the top's probabilities sum to at most 1.
lp = client.chat.completions.create(
    model=model, messages=messages, temperature=0, max_tokens=12, logprobs=True, top_logprobs=5
)
content = lp.choices[0].logprobs.content
assert content, lp
assert bytes(b for t in content for b in t.bytes).decode() == lp.choices[0].message.content, lp
for t in content:
    assert len(t.top_logprobs) == 5, t
    assert t.top_logprobs[0].token == t.token and t.top_logprobs[0].logprob == t.logprob, t
    assert sum(math.exp(x.logprob) for x in t.top_logprobs) <= 1 + 1e-9, t
    assert all(a.logprob >= b.logprob for a, b in zip(t.top_logprobs, t.top_logprobs[1:])), t
streamed = [
    t
    for c in client.chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=12, logprobs=True,
        top_logprobs=5, stream=True,
    )
    if c.choices and c.choices[0].logprobs
    for t in c.choices[0].logprobs.content
]
assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in content]

# Log-probabilities, completions: logprobs=N.
lp = client.completions.create(
    model=model, prompt=france["text"], max_tokens=n, temperature=0, logprobs=3
).choices[0]
assert "".join(lp.logprobs.tokens) == lp.text, lp
for chosen, top in zip(lp.logprobs.token_logprobs, lp.logprobs.top_logprobs):
    assert chosen == max(top.values()), (chosen, top)
    assert sum(math.exp(x) for x in top.values()) <= 1 + 1e-9, top

# Embeddings: the client asks for base64 and decodes it; each is L2-normalised.
emb = client.embeddings.create(model=model, input=["The capital of France is Paris.", "def fib(n):"])
assert [d.index for d in emb.data] == [0, 1], emb
for d in emb.data:
    assert len(d.embedding) == len(emb.data[0].embedding) > 0, d
    assert abs(math.sqrt(sum(x * x for x in d.embedding)) - 1) < 1e-3, d
assert emb.usage.prompt_tokens > 0, emb.usage
floats = client.embeddings.create(model=model, input="def fib(n):", encoding_format="float")
assert max(abs(a - b) for a, b in zip(floats.data[0].embedding, emb.data[1].embedding)) < 1e-6

# Fields the server does not implement: a 400 naming each.
for create, kwargs, field in [
    (client.chat.completions.create, {"response_format": {"type": "json_object"}}, "response_format"),
    (client.chat.completions.create, {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
    (client.chat.completions.create, {"tool_choice": "required"}, "tool_choice"),
    (client.chat.completions.create, {"extra_body": {"grammar": "root ::= \"a\""}}, "grammar"),
    (client.chat.completions.create, {"extra_body": {"json_schema": {"type": "object"}}}, "json_schema"),
    (client.chat.completions.create, {"extra_body": {"mirostat": 2}}, "mirostat"),
    (client.chat.completions.create, {"store": True}, "store"),
    (client.completions.create, {"echo": True}, "echo"),
    (client.completions.create, {"suffix": "end"}, "suffix"),
    (client.completions.create, {"best_of": 2}, "best_of"),
]:
    body = {"messages": messages} if create == client.chat.completions.create else {"prompt": "Hi"}
    try:
        create(model=model, max_tokens=4, **body, **kwargs)
    except openai.BadRequestError as e:
        assert e.status_code == 400 and e.param == field and field in e.message, (field, e.message)
    else:
        raise AssertionError(f"{field} was accepted")

# A server with an API key: 401 without it (OpenAI's error shape), answers with it, and
# /health stays open.
for wrong in ["unused", key + "x"]:
    try:
        openai.OpenAI(base_url=keyed_base + "/v1", api_key=wrong, max_retries=0).models.list()
    except openai.AuthenticationError as e:
        assert e.status_code == 401 and e.code == "invalid_api_key", e
    else:
        raise AssertionError(f"the key {wrong!r} was accepted")
keyed = openai.OpenAI(base_url=keyed_base + "/v1", api_key=key, max_retries=0, timeout=120)
reply = keyed.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=24)
assert "Paris" in reply.choices[0].message.content, reply
with urllib.request.urlopen(keyed_base + "/health") as r:
    assert r.status == 200

print("openai client test: ok (openai", openai.__version__ + ")")
