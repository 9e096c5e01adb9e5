"""What an image or audio clip costs a model, from its header, never from its base64 length.

Images: (width × height) / 750 tokens, at most 1,600 — the rule Anthropic publishes for Claude, which
scales larger images down to about 1.15 megapixels first; other vision models land in the same range.
An image whose header cannot be read counts the cap. Audio: 32 tokens a second (Gemini's published
rate); the duration comes from a WAV header, else from the size at 128 kbit/s.
"""

from __future__ import annotations

import base64
import binascii
import struct

IMAGE_TOKENS_PER_PIXEL = 1 / 750
IMAGE_TOKEN_CAP = 1600
AUDIO_TOKENS_PER_SECOND = 32
COMPRESSED_AUDIO_BYTES_PER_SECOND = 16_000  # 128 kbit/s
_HEAD_B64 = 96 * 1024  # a JPEG's size marker can sit after tens of KB of metadata


def _head(data: str | bytes, b64_chars: int = _HEAD_B64) -> bytes:
    """The first bytes of a base64 payload (or a `data:` URI), decoded."""
    if isinstance(data, bytes):
        data = data.decode("ascii", "ignore")
    if data.startswith("data:"):
        data = data.partition(",")[2]
    piece = data[: b64_chars - b64_chars % 4]
    try:
        return base64.b64decode(piece, validate=False)
    except (binascii.Error, ValueError):
        return b""


def image_size(head: bytes) -> tuple[int, int] | None:
    """(width, height) from a PNG, GIF, JPEG or WebP header."""
    if head[:8] == b"\x89PNG\r\n\x1a\n" and len(head) >= 24:
        return struct.unpack(">II", head[16:24])
    if head[:6] in (b"GIF87a", b"GIF89a") and len(head) >= 10:
        return struct.unpack("<HH", head[6:10])
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP" and len(head) >= 30:
        chunk = head[12:16]
        if chunk == b"VP8X":
            w = int.from_bytes(head[24:27], "little") + 1
            h = int.from_bytes(head[27:30], "little") + 1
            return w, h
        if chunk == b"VP8 ":
            w, h = struct.unpack("<HH", head[26:30])
            return w & 0x3FFF, h & 0x3FFF
        if chunk == b"VP8L" and len(head) >= 25:
            bits = int.from_bytes(head[21:25], "little")
            return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if head[:2] == b"\xff\xd8":
        i = 2
        while i + 9 < len(head):
            if head[i] != 0xFF:
                i += 1
                continue
            marker = head[i + 1]
            if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
                i += 2
                continue
            length = int.from_bytes(head[i + 2 : i + 4], "big")
            if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
                h, w = struct.unpack(">HH", head[i + 5 : i + 9])
                return w, h
            i += 2 + length
    return None


def image_tokens(data: str | bytes) -> int:
    size = image_size(_head(data))
    if not size or size[0] <= 0 or size[1] <= 0:
        return IMAGE_TOKEN_CAP
    return max(1, min(IMAGE_TOKEN_CAP, round(size[0] * size[1] * IMAGE_TOKENS_PER_PIXEL)))


def audio_tokens(data: str | bytes) -> int:
    head = _head(data, 256)
    encoded = len(data)
    decoded_bytes = encoded * 3 // 4
    seconds = decoded_bytes / COMPRESSED_AUDIO_BYTES_PER_SECOND
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE" and len(head) >= 44:
        byte_rate = int.from_bytes(head[28:32], "little")
        if byte_rate > 0:
            seconds = max(0, decoded_bytes - 44) / byte_rate
    return max(1, round(seconds * AUDIO_TOKENS_PER_SECOND))
