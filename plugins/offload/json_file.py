"""Reading an offloaded JSON file: small files parsed once and cached, large ones streamed with ijson
(C backend) in bounded memory."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ijson

from gateway.services.files import VersionedCache

SMALL_FILE = 4 * 1024 * 1024  # parsed whole and cached; larger files are streamed
CACHE_BYTES = 64 * 1024 * 1024  # total size of files kept parsed


class BrokenJSON(Exception):
    pass


_PARSED: VersionedCache[Any] = VersionedCache(max_items=64, max_file_bytes=CACHE_BYTES)


def parsed(path: Path) -> Any:
    """The whole value of a small file, parsed once per file version."""

    def load() -> Any:
        with open(path, encoding="utf-8") as fh:
            try:
                return json.load(fh)
            except json.JSONDecodeError as exc:
                raise BrokenJSON(
                    f"the file is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
                ) from None

    return _PARSED.get(path, load)


def is_small(path: Path) -> bool:
    return path.stat().st_size <= SMALL_FILE


@contextmanager
def valid_json() -> Iterator[None]:
    try:
        yield
    except ijson.JSONError as exc:
        raise BrokenJSON(f"the file is not valid JSON ({exc})") from None


def events(path: Path) -> Any:
    """ijson parse events of the whole file, streamed."""
    fh = open(path, "rb")  # noqa: SIM115 - closed by the generator's finally
    try:
        yield from ijson.parse(fh, use_float=True)
    except ijson.JSONError as exc:
        raise BrokenJSON(f"the file is not valid JSON ({exc}); try response_search or a line range instead") from None
    finally:
        fh.close()


def items(path: Path, prefix: str) -> Any:
    """The values at an ijson prefix (`data.item`), one at a time."""
    with open(path, "rb") as fh, valid_json():
        yield from ijson.items(fh, prefix, use_float=True)
