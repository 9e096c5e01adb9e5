"""gateway.services.costs and media: one figure per result; images by their pixels, not their base64."""

import base64
import struct
import zlib

import mcp_types as types

from gateway.services.costs import result_cost
from gateway.services.media import IMAGE_TOKEN_CAP, audio_tokens, image_size, image_tokens
from gateway.services.tokens import estimate_tokens


def png(width: int, height: int) -> str:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    raw = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", len(ihdr)) + chunk + struct.pack(">I", zlib.crc32(chunk))
    return base64.b64encode(raw + b"\x00" * 50_000).decode()  # a big payload: the header decides


def text(t: str) -> types.TextContent:
    return types.TextContent(text=t)


def test_structured_copy_of_the_text_counts_once() -> None:
    body = "line of a file\n" * 400
    plain = result_cost(types.CallToolResult(content=[text(body)]))
    copied = result_cost(types.CallToolResult(content=[text(body)], structured_content={"content": body}))
    assert copied.duplicate == 0 and plain.tokens <= copied.tokens < 1.2 * plain.tokens
    json_twice = result_cost(
        types.CallToolResult(content=[text('{"a": [1, 2, 3]}')], structured_content={"a": [1, 2, 3]})
    )
    assert json_twice.duplicate == 0
    different = result_cost(types.CallToolResult(content=[text(body)], structured_content={"rows": 400}))
    assert different.duplicate is None and different.tokens > plain.tokens  # its own data: added


def test_images_cost_their_pixels() -> None:
    assert image_size(base64.b64decode(png(640, 480)[:100])) == (640, 480)
    assert image_tokens(png(640, 480)) == round(640 * 480 / 750)
    assert image_tokens(png(4000, 3000)) == IMAGE_TOKEN_CAP  # scaled down by hosts
    assert image_tokens(base64.b64encode(b"not an image" * 100).decode()) == IMAGE_TOKEN_CAP
    data = png(64, 64)
    cost = result_cost(types.CallToolResult(content=[types.ImageContent(data=data, mime_type="image/png")]))
    assert cost.tokens == round(64 * 64 / 750) and cost.tokens < estimate_tokens(data) / 100
    assert cost.size == len(data)


def test_audio_costs_its_duration() -> None:
    rate = 16000 * 2  # 16 kHz mono, 16-bit
    header = b"RIFF" + b"\x00" * 4 + b"WAVE" + b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, 16000, rate, 2, 16)
    wav = header + b"data" + struct.pack("<I", rate * 10) + b"\x00" * (rate * 10)
    assert abs(audio_tokens(base64.b64encode(wav).decode()) - 320) <= 2  # 10 s at 32 tokens a second


def test_a_prefix_over_the_token_limit_tells_the_whole_is_over(monkeypatch) -> None:
    """`tokens_over` decides from a prefix only when it is sure: whenever it says so, the whole result
    costs more than the limit, with the real tokenizers and with the built-in rates (their floor for the
    prefix: they rate a prefix by its own kind of text); a short text or one of long runs is left to the
    whole count, and so is a text whose whole is estimated from slices."""
    import json
    import random

    import gateway.services.costs as costs
    import gateway.services.tokens as tokens
    from gateway.services.costs import tokens_over

    exact = tokens.TokenEstimator()  # counting exactly, whatever other tests left in the process's one
    assert exact.load_exact()
    monkeypatch.setattr(tokens, "ESTIMATOR", exact)
    monkeypatch.setattr(costs, "ESTIMATOR", exact)

    rng = random.Random(5)
    log = "".join(f"2026-12-07 21:{i % 60:02d}:00 status installed libfoo{i}:amd64 1.{i}\n" for i in range(6000))
    kinds = {
        "log": log,
        "json": json.dumps([{"id": i, "name": f"항목 {i}", "tags": ["a", "b"]} for i in range(4000)]),
        "korean": "세션을 저장하고 다시 불러옵니다. " * 8000,
        "code": "def f(x):\n    return x * 2  # doubled\n" * 5000,
        "spaces": " " * 200_000 + "end",
        "base64": "".join(
            rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/") for _ in range(200_000)
        ),
        "short": "a few words",
    }
    for estimator in (exact, tokens.TokenEstimator(exact=False)):
        monkeypatch.setattr(tokens, "ESTIMATOR", estimator)
        monkeypatch.setattr(costs, "ESTIMATOR", estimator)
        told = 0
        for name, body in kinds.items():
            for limit in (100, 1000, 4000, 20_000):
                result = types.CallToolResult(content=[text(body)], structured_content={"content": body})
                if tokens_over(result, limit):
                    told += 1
                    assert result_cost(result).tokens > limit, (name, limit, estimator.exact)
        assert told >= 10  # it does tell, for most long texts
    assert not tokens_over(types.CallToolResult(content=[text("a few words")]), 1)
    assert tokens_over(types.CallToolResult(content=[text(log)]), 4000)
    sampled = "가" * 40_000 + " " * tokens.SAMPLE_ABOVE  # its whole is estimated from slices that may miss the start
    assert not tokens_over(types.CallToolResult(content=[text(sampled)]), 4000)
