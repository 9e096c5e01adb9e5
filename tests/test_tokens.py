"""Token estimate vs real tokenizers; calibration, discovery and backoff against a real HTTP endpoint."""

from __future__ import annotations

import socket
import statistics
import sys
import threading
import time
from pathlib import Path

import anyio
import pytest
import token_corpus
from conftest import inproc, make_settings, probe

from gateway.services import tokens
from gateway.services.model_endpoint import MARGIN, SAMPLES, LLMUnavailable, ModelEndpoint, split_by_tokens
from gateway.services.tokens import TokenEstimator
from gateway.settings import LLMSettings

sys.path.insert(0, str(Path(__file__).parent / "servers"))
from fake_llm import FakeLLM

BUILT_IN = TokenEstimator()  # the built-in rates, whatever a gateway in another test calibrated


def endpoint(settings: LLMSettings, workspace: Path) -> ModelEndpoint:
    """A model endpoint client with an estimator of its own: calibration stays inside the test."""
    return ModelEndpoint(settings, workspace, TokenEstimator())


@pytest.fixture
def fake_llm(request):
    fake = FakeLLM(flavor=getattr(request, "param", "lmstudio")).start()
    yield fake
    fake.stop()


@pytest.mark.parametrize("kind", list(token_corpus.KINDS))
def test_estimate_never_undercounts_and_stays_close(kind: str) -> None:
    """In-sample (the fit saw these kinds); bench/tokens.py reports the held-out figures."""
    toks = token_corpus.tokenizers()
    windows = token_corpus.KINDS[kind](120)
    if not windows:
        pytest.skip(f"{kind}: its source is not installed on this machine")
    assert len(windows) >= 100
    under = {name: 0 for name in toks}
    ratios = []
    for window in windows:
        counts = {name: len(tok.encode(window)) for name, tok in toks.items()}
        estimate = BUILT_IN.estimate(window)
        for name, count in counts.items():
            under[name] += estimate < count
        ratios.append(estimate / max(counts.values()))
    for name, count in under.items():
        assert count / len(windows) <= 0.01, f"{kind}: {count} of {len(windows)} windows undercounted vs {name}"
    assert statistics.median(ratios) <= 1.35, f"{kind}: median over-estimate {statistics.median(ratios):.2f}"


def test_estimate_handles_edge_content() -> None:
    assert BUILT_IN.estimate("") == 0
    assert BUILT_IN.estimate("a") >= 1
    toks = token_corpus.tokenizers()
    degenerate = [
        "word " * 300,
        "a b c d e f g " * 60,
        " ".join(f"user{i}" for i in range(300)),
        "x" * 3000,
        "🎉🚀✨" * 50,
        "Привет, как дела? " * 50,
        "é" * 300,
        "\n\n\n" * 100,
        "    " * 300,
    ]
    for text in degenerate:
        assert BUILT_IN.estimate(text) >= max(len(t.encode(text)) for t in toks.values()), text[:20]
    # a large text is estimated from samples, still leaning high
    big = "".join(token_corpus.json_minified(60)) * 8
    assert len(big) > tokens.SAMPLE_ABOVE
    exact = len(toks["qwen3.6"].encode(big))
    assert exact <= BUILT_IN.estimate(big) <= exact * 1.4


def test_classify_kinds() -> None:
    assert tokens.classify(token_corpus.korean(1)[0]) == "cjk"
    assert tokens.classify(token_corpus.json_minified(1)[0].join("{}")) == "json"
    assert tokens.classify(token_corpus.english(5)[0]) == "prose"


async def _calibrated(fake: FakeLLM, tmp_path: Path) -> ModelEndpoint:
    client = endpoint(LLMSettings(base_url=fake.url, timeout_seconds=10), tmp_path)
    await client.start()
    return client


@pytest.mark.anyio
async def test_slope_calibration_recovers_the_endpoint_rate(fake_llm: FakeLLM, tmp_path: Path) -> None:
    client = await _calibrated(fake_llm, tmp_path)
    try:
        assert client.calibration and client.calibration["method"] == "slope"
        assert client.model == "qwen-test"
        for kind, unit in SAMPLES.items():
            text = unit * 20
            measured = client.tokens.scales()[kind] / MARGIN[kind] * tokens.raw_estimate(text)
            assert abs(measured / fake_llm.count(text) - 1) <= 0.05, kind
        # calibrated counts still lean high (the margin) on real text, and Korean drops from the
        # built-in (cl100k-safe) rate to near Qwen's real rate
        for kind in ("korean", "english", "python", "json-min"):
            ratios = [client.tokens.estimate(w) / fake_llm.count(w) for w in token_corpus.KINDS[kind](60)]
            assert min(ratios) >= 1.0 and statistics.median(ratios) < 1.35, kind
        # discovery read LM Studio's loaded context length; the cache is written for next time
        assert client.window == 16384 and "LM Studio" in client.window_source
        assert (tmp_path / "calibration.json").is_file()
    finally:
        await client.aclose()
    again = endpoint(LLMSettings(base_url=fake_llm.url, model="qwen-test"), tmp_path)
    assert again.tokens.scales() == dict.fromkeys(tokens.KINDS, 1.0)
    assert again.load_cached_calibration() and again.tokens.scales() == client.calibration["scales"]


@pytest.mark.anyio
@pytest.mark.parametrize("fake_llm", ["llamacpp"], indirect=True)
async def test_exact_tokenize_route_is_preferred(fake_llm: FakeLLM, tmp_path: Path) -> None:
    client = await _calibrated(fake_llm, tmp_path)
    await client.aclose()
    assert client.calibration["method"] == "tokenize"
    assert not fake_llm.chat_calls()
    assert client.window == 12288 and "llama.cpp" in client.window_source


@pytest.mark.anyio
@pytest.mark.parametrize("fake_llm", ["ollama"], indirect=True)
async def test_ollama_window_discovery(fake_llm: FakeLLM, tmp_path: Path) -> None:
    client = await _calibrated(fake_llm, tmp_path)
    await client.aclose()
    assert client.window == 8192 and "num_ctx" in client.window_source


@pytest.mark.anyio
async def test_absurd_slope_is_rejected(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.constant_usage = True
    client = await _calibrated(fake_llm, tmp_path)
    await client.aclose()
    assert client.calibration is None
    assert client.tokens.scales() == dict.fromkeys(tokens.KINDS, 1.0)


@pytest.mark.anyio
async def test_dead_endpoint_backs_off(tmp_path: Path) -> None:
    """A server that accepts and never answers: the first call waits out the timeout, the second
    returns at once without touching the network."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:  # the 0.1 s timeout, or the socket closed at the end
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    port = listener.getsockname()[1]
    client = endpoint(LLMSettings(base_url=f"http://127.0.0.1:{port}/v1", model="m", timeout_seconds=1), tmp_path)
    try:
        started = time.monotonic()
        with pytest.raises(LLMUnavailable):
            await client.chat([{"role": "user", "content": "hi"}])
        first = time.monotonic() - started
        connections = len(accepted)
        started = time.monotonic()
        with pytest.raises(LLMUnavailable, match="not tried again yet"):
            await client.chat([{"role": "user", "content": "hi"}])
        second = time.monotonic() - started
        assert first >= 0.9 and second < first / 10
        assert len(accepted) == connections, "the backed-off call still touched the network"
    finally:
        stop.set()
        thread.join(5)
        await client.aclose()
        listener.close()
        for conn in accepted:
            conn.close()


@pytest.mark.anyio
async def test_long_summaries_are_map_reduced(fake_llm: FakeLLM, tmp_path: Path) -> None:
    client = endpoint(LLMSettings(base_url=fake_llm.url, model="qwen-test"), tmp_path)
    text = "\n".join(f"note {i}: deploy step {i} touched service-{i % 7} and file src/mod_{i}.py" for i in range(3000))
    summary = await client.summarize(text, "Summarize.")
    await client.aclose()
    calls = fake_llm.chat_calls()
    assert len(calls) >= 3  # several slices, then the reduce
    assert summary.startswith("SUMMARY")
    pieces = split_by_tokens(text, 3000)
    assert "".join(pieces) == text and all(tokens.estimate_tokens(p) <= 3100 for p in pieces)


@pytest.mark.anyio
async def test_gateway_calibrates_in_background_and_reports_it(fake_llm: FakeLLM, tmp_path: Path) -> None:
    settings = make_settings(tmp_path, {"p": probe("p")}, llm={"base_url": fake_llm.url})
    async with inproc(settings) as (gateway, session):
        # serving does not wait for calibration
        assert (await session.list_tools()).tools
        with anyio.fail_after(20):
            while not gateway.llm.calibration:
                await anyio.sleep(0.05)
        assert gateway.window.size() == 16384 and gateway.window.budget() == 8192
        assert gateway.window.max_response_tokens("p") == 4096
