"""Token estimate vs real tokenizers; calibration, discovery and backoff against a real HTTP endpoint."""

from __future__ import annotations

import socket
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

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

BUILT_IN = TokenEstimator(exact=False)  # the built-in rates, whatever a gateway in another test calibrated


def endpoint(settings: LLMSettings, workspace: Path) -> ModelEndpoint:
    """A model endpoint client with an estimator of its own: calibration stays inside the test."""
    return ModelEndpoint(settings, workspace, TokenEstimator())


@pytest.fixture
def fake_llm(request):
    fake = FakeLLM(flavor=getattr(request, "param", "lmstudio")).start()
    yield fake
    fake.stop()


@pytest.mark.parametrize("kind", list(token_corpus.KINDS))
def test_real_tokenizers_count_every_held_out_kind_within_the_target(
    kind: str, real_tokenizers: dict[str, object]
) -> None:
    """Once loaded, a named family's figure is its tokenizer's own count (cl100k checked against tiktoken,
    another implementation), and `auto` is never below any of the four families' counts while its median
    stays within 1.15x of the largest (the margin was set on the tuning half; these windows are held out)."""
    windows = token_corpus.kind_windows(kind, 120, "held")
    if not windows:
        pytest.skip(f"{kind}: its source is not installed on this machine")
    real = {f: [len(real_tokenizers[t].encode(w)) for w in windows] for f, t in token_corpus.FAMILIES.items()}
    for family, counts in real.items():
        named = TokenEstimator(family)
        assert named.load_exact() and named.counting_exactly()
        assert [named.estimate(w) for w in windows] == counts, family
    auto = TokenEstimator()
    widest = [max(counts) for counts in zip(*real.values(), strict=True)]
    estimates = [auto.estimate(w) for w in windows]
    assert all(e >= c for e, c in zip(estimates, widest, strict=True))
    assert statistics.median(e / c for e, c in zip(estimates, widest, strict=True)) <= 1.15


def test_the_tokenizers_load_in_the_background_from_the_first_long_text() -> None:
    """In a fresh process: a short text is estimated and loads nothing; the first long one is estimated
    at once (the built-in rates) and starts the load; later figures are the real counts."""
    script = """
import sys, time
from gateway.services import tokens, tokenizers
est = tokens.TokenEstimator("cl100k")
short = "hello world " * 20
first = est.estimate(short)
time.sleep(0.3)
assert not est.counting_exactly() and "quicktok" not in sys.modules, "a short text loaded the tokenizers"
long_text = "The gateway keeps oversized results out of the window. " * 40
rough = est.estimate(long_text)
deadline = time.monotonic() + 20
while not est.counting_exactly():
    assert time.monotonic() < deadline, "the tokenizers never loaded"
    time.sleep(0.02)
print(first, rough, est.estimate(long_text), est.estimate(short))
"""
    import subprocess

    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    first, rough, exact, short_exact = map(int, out.stdout.split())
    cl100k = token_corpus.tokenizers()["cl100k"]
    assert exact == len(cl100k.encode("The gateway keeps oversized results out of the window. " * 40))
    assert short_exact == len(cl100k.encode("hello world " * 20)) <= first
    assert rough > exact  # the built-in rates lean high until then


def test_the_tokenizers_load_in_a_pause_between_calls_not_during_them() -> None:
    """In a fresh process whose host starts a call every 0.1 s: the load (its native part holds the GIL
    ~0.17 s at a time) waits while the calls keep coming, and happens once they pause."""
    script = """
import threading, time
from gateway.services import activity, tokens, tokenizers
tokenizers.LOAD_DELAY = 0.0
busy = threading.Event()
def calls():
    while not busy.wait(0.1):
        activity.call_started()
activity.call_started()
threading.Thread(target=calls, daemon=True).start()
est = tokens.TokenEstimator("cl100k")
est.estimate("The gateway keeps oversized results out of the window. " * 40)
time.sleep(2.0)
during = est.counting_exactly()
busy.set()
stopped = time.monotonic()
while not est.counting_exactly():
    assert time.monotonic() - stopped < 20, "the tokenizers never loaded"
    time.sleep(0.02)
print(during, round(time.monotonic() - stopped, 2))
"""
    import subprocess

    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    during, after = out.stdout.split()
    assert during == "False", "the tokenizers loaded while calls kept coming"
    assert float(after) >= 0.4  # a pause of QUIET_SECONDS first


def test_a_caller_that_needs_exact_counts_now_does_not_wait_for_a_pause() -> None:
    """A document's ingest loads the tokenizers before it counts; the background loader had claimed them
    and waits for a pause that calls every 0.1 s never give: the ingest's load goes ahead at once."""
    script = """
import threading, time
from gateway.services import activity, tokens, tokenizers
tokenizers.LOAD_DELAY = 0.0
def calls():
    while True:
        activity.call_started()
        time.sleep(0.1)
threading.Thread(target=calls, daemon=True).start()
est = tokens.TokenEstimator("auto")
est.estimate("The gateway keeps oversized results out of the window. " * 40)  # the background claims them
time.sleep(0.5)
began = time.monotonic()
print(est.load_exact(), round(time.monotonic() - began, 1))
"""
    import subprocess

    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    loaded, seconds = out.stdout.split()
    assert loaded == "True" and float(seconds) < 20  # 60 s and False before


@pytest.mark.anyio
async def test_a_gateway_process_counts_with_the_real_tokenizers_after_its_first_long_result(tmp_path: Path) -> None:
    """Two gateways as a host starts them, side by side: with the default settings the first long result
    is counted with the built-in estimate and starts the tokenizers' load in the background, and later
    figures are the real counts (`context_status` says which); with `exact_tokens = false`, given the
    same result at the same moment, they still are not by then, nor half a second later."""
    from conftest import ok, stdio_gateway, write_config

    def config(name: str, exact: bool) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        return write_config(folder, {"probe": probe()}, plugins=["memory"], exact_tokens=exact)

    async def counted(session: Any) -> bool:
        status = await ok(session, "context_status", {"session_id": "s"})
        if "counted for the widest common tokenizer" in status["token_counts"]:
            return True
        assert "built-in estimate" in status["token_counts"]
        return False

    long_result = {"text": "a tool result well over EXACT_FROM characters " * 40}
    async with (
        stdio_gateway(config("exact", True), tmp_path / "exact.log") as exact,
        stdio_gateway(config("estimate", False), tmp_path / "estimate.log") as estimate,
    ):
        for session in (exact, estimate):
            await session.list_tools()
            await session.call_tool("probe__echo", long_result)
        with anyio.fail_after(30):
            while not await counted(exact):
                await anyio.sleep(0.6)  # a pause between calls, as a model's turn: the tokenizers load in one
        until = time.monotonic() + 0.5
        while time.monotonic() < until:
            assert not await counted(estimate)
            await anyio.sleep(0.1)


def test_a_lone_surrogate_is_counted_by_the_real_tokenizers() -> None:
    """An upstream's JSON can hold a lone surrogate escape; native tokenizers refuse such a str."""
    auto = TokenEstimator()
    assert auto.load_exact()
    assert auto.estimate("caf\udce9 " * 300) >= auto.estimate("caf? " * 300)


# Held-out medians (estimate / real count) the shipped fit reaches, by the kind the estimate sees at
# run time; the target is 1.15, reached for prose, JSON and CJK, not for code (docs/token-estimate.md).
MEDIAN_CEILING = {"prose": 1.2, "json": 1.2, "cjk": 1.15, "code": 1.45}
UNDER_AT_MOST = 0.02  # of a kind's held-out windows (the target is 0: not reached for Markdown)
# `auto` is never below the single widest-lean estimate (the per-family fits undercounted cut answers of
# CSV lines, logs and query rows), so its medians are that estimate's: 1.11-1.36 held out
AUTO_CEILING = 1.4


@pytest.fixture(scope="module")
def real_tokenizers() -> dict[str, object]:
    return token_corpus.tokenizers()


@pytest.mark.parametrize("kind", list(token_corpus.KINDS))
def test_held_out_estimate_never_undercounts_and_stays_close(kind: str, real_tokenizers: dict[str, object]) -> None:
    """On the held-out half of each kind's text (the fit saw only the tuning half): per tokenizer family,
    the estimate named for it is never below its real count; `auto` is never below any of them."""
    windows = token_corpus.kind_windows(kind, 120, "held")
    if not windows:
        pytest.skip(f"{kind}: its source is not installed on this machine")
    assert len(windows) >= 100
    real = {f: [len(real_tokenizers[t].encode(w)) for w in windows] for f, t in token_corpus.FAMILIES.items()}
    widest = [max(counts) for counts in zip(*real.values(), strict=True)]
    runtime = {tokens.classify(w) for w in windows}
    ceiling = max(MEDIAN_CEILING[k] for k in runtime)
    for family, counts in [*real.items(), ("auto", widest)]:
        estimator = TokenEstimator(family, exact=False)
        estimates = [estimator.estimate(w) for w in windows]
        under = sum(e < c for e, c in zip(estimates, counts, strict=True))
        if family == "auto":
            under = sum(any(e < real[f][i] for f in real) for i, e in enumerate(estimates))
        assert under <= UNDER_AT_MOST * len(windows), (
            f"{kind}: {under} of {len(windows)} held-out windows undercounted for {family}"
        )
        median = statistics.median(e / c for e, c in zip(estimates, counts, strict=True))
        limit = AUTO_CEILING if family == "auto" else ceiling
        assert median <= limit, f"{kind} ({family}): median over-estimate {median:.2f}"


def test_a_named_tokenizer_counts_a_repeated_log_closer_than_auto(real_tokenizers: dict[str, object]) -> None:
    """The report's case: a 3.6 MB log of repeated lines. `auto` counts for Qwen (a token per digit);
    a host on cl100k gets a figure near its own count, still above it."""
    windows = token_corpus.kind_windows("app-log", 400, "held")
    text = "\n".join(windows * 5)
    assert len(text) > 3_000_000
    real = len(real_tokenizers["cl100k"].encode(text))
    named, auto = (TokenEstimator(f, exact=False).estimate(text) for f in ("cl100k", "auto"))
    assert real <= named <= 1.45 * real and named < auto
    with pytest.raises(ValueError, match="unknown tokenizer"):
        TokenEstimator("gpt2")


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
    exact = max(len(t.encode(big)) for t in toks.values())  # the widest real count, as `auto` leans
    assert exact <= BUILT_IN.estimate(big) <= exact * 1.45  # the larger of two estimates per sample


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
