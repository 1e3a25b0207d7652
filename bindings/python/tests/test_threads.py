"""The GIL is released during compute; a session refuses a second concurrent caller."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

import kvcore

# Never stop early: the special tokens (<|endoftext|>, <|im_start|>, <|im_end|>) banned.
NO_STOP = {0: float("-inf"), 1: float("-inf"), 2: float("-inf")}
TOKENS = 32  # about a second on one core of this machine


@pytest.fixture(scope="module")
def simd_model() -> kvcore.Model:
    return kvcore.Model("smollm2", backend="simd")


def generate_long(model: kvcore.Model, session: kvcore.Session) -> str:
    """TOKENS greedy tokens of a story, never stopping early, in ``session``."""
    return model.generate(
        "Once upon a time",
        max_tokens=TOKENS,
        temperature=0,
        logit_bias=NO_STOP,
        session=session,
    )


def test_generations_in_two_threads_overlap(simd_model):
    assert simd_model.backend == "simd" and simd_model.threads == 1
    barrier = threading.Barrier(2)
    results: dict[int, tuple[float, float, kvcore.GenerationStats]] = {}
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            session = kvcore.Session(simd_model)
            barrier.wait()
            start = time.perf_counter()
            generate_long(simd_model, session)
            results[i] = (start, time.perf_counter(), session.last_stats)
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    starts = [r[0] for r in results.values()]
    ends = [r[1] for r in results.values()]
    wall = max(ends) - min(starts)
    for _, _, stats in results.values():
        assert stats.generated_tokens == TOKENS
    # Each generation's compute time as the engine measured it. A thread waiting for
    # the GIL inside its call would not be computing, so with the GIL held the two
    # computations could not overlap and the wall time would be at least their sum.
    compute = [(s.ttft_ms + s.decode_ms) / 1e3 for _, _, s in results.values()]
    durations = [end - start for start, end, _ in results.values()]
    detail = f"wall {wall:.3f}s, calls {durations}, compute {compute}"
    assert wall < 0.8 * sum(compute), detail
    assert wall < 0.8 * sum(durations), detail


def test_concurrent_use_of_one_session_is_refused(simd_model):
    session = kvcore.Session(simd_model)
    started = threading.Event()
    outcome: list[object] = []

    def generate() -> None:
        started.set()
        outcome.append(generate_long(simd_model, session))

    t = threading.Thread(target=generate)
    t.start()
    started.wait()
    refused = 0
    deadline = time.perf_counter() + 30
    while t.is_alive() and time.perf_counter() < deadline:
        try:
            session.tokens
        except kvcore.SessionBusyError as e:
            assert isinstance(e, RuntimeError)
            assert "in use" in str(e)
            refused += 1
        time.sleep(0.01)
    t.join()
    assert refused > 0
    assert isinstance(outcome[0], str)
    # Given back: usable again, holding the prompt and the generated tokens.
    assert len(session) == session.last_stats.prompt_tokens + TOKENS - 1


def test_one_model_many_threads(model):
    """One Model shared by threads, each in its own session: same greedy text."""
    expected = model.generate("The capital of France is", max_tokens=8, temperature=0)
    out: list[str] = []

    def run() -> None:
        out.append(model.generate("The capital of France is", max_tokens=8, temperature=0))

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == [expected] * 3


def test_ctrl_c_cancels_a_generation(model):
    """SIGINT during a long generation raises KeyboardInterrupt promptly; the session
    keeps what was generated."""
    session = kvcore.Session(model)
    sent = []

    def interrupt():
        sent.append(time.perf_counter() - start)
        os.kill(os.getpid(), signal.SIGINT)

    # Python's own handler, whatever this process inherited: a shell that starts a job in
    # the background (`.ci/run &`) starts it with SIGINT ignored, and Python then installs
    # no handler, so the signal was lost (failed twice in CI that way, 2026-12-05).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.5, interrupt)
    start = time.perf_counter()
    timer.start()
    try:
        model.generate(
            "Once upon a time",
            max_tokens=1000,
            temperature=0,
            logit_bias=NO_STOP,
            session=session,
        )
    except KeyboardInterrupt:
        pass
    else:
        s = session.last_stats
        pytest.fail(
            f"no KeyboardInterrupt: SIGINT sent at {sent} s, generate returned after "
            f"{time.perf_counter() - start:.2f} s, finish_reason {s.finish_reason!r}, "
            f"{s.generated_tokens} tokens"
        )
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert time.perf_counter() - start < 10
    stats = session.last_stats
    assert stats.finish_reason == "cancelled"
    assert 0 < stats.generated_tokens < 1000
    assert len(session) == stats.prompt_tokens + stats.generated_tokens - 1
