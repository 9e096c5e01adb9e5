"""Paths into JSON: dotted (`data.3.name`, `-1` for the last element) and JSONPath (`$.data[3].name`).

A path is split into simple steps (keys and indices, which can be streamed to) and, where
JSONPath uses wildcards, filters, slices or recursive descent, a remainder that jsonpath-ng
evaluates on the value the simple steps reach.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

Step = str | int


class PathError(ValueError):
    pass


_DOTTED_KEY = re.compile(r"[^.\[\]]+")
_BRACKET = re.compile(r"""\[\s*(?:(-?\d+)|'((?:[^'\\]|\\.)*)'|"((?:[^"\\]|\\.)*)")\s*\]""")


def parse_path(path: str | None) -> tuple[list[Step], str | None]:
    """`(steps, jsonpath_remainder)`; the remainder is None for a simple path."""
    if path is None:
        return [], None
    if not isinstance(path, str):
        raise PathError("json_path must be a string like 'data.0.name' or '$.data[0].name'")
    text = path.strip()
    if text in ("", "$", "."):
        return [], None
    return _scan(text, 1 if text.startswith("$") else 0)


_INT = re.compile(r"-?\d+")


def _scan(text: str, pos: int) -> tuple[list[Step], str | None]:
    """Keys and indices up to the first wildcard, filter, slice or recursive descent; that part and
    everything after it is the JSONPath remainder."""
    steps: list[Step] = []
    while pos < len(text):
        if text.startswith("..", pos):
            return steps, "$" + text[pos:]
        if text[pos] == ".":
            pos += 1
            continue
        bracket = _BRACKET.match(text, pos)
        if bracket:
            steps.append(_bracket_step(bracket))
            pos = bracket.end()
            continue
        key = _DOTTED_KEY.match(text, pos)
        if key and "*" not in key.group():
            token = key.group()
            steps.append(int(token) if _INT.fullmatch(token) else token)
            pos = key.end()
            continue
        if key or text[pos] == "[":
            return steps, "$" + ("" if text[pos] == "[" else ".") + text[pos:]
        raise PathError(f"cannot read json_path {text!r} at character {pos + 1}; use 'data.0.name' or '$.data[0].name'")
    return steps, None


def _bracket_step(match: re.Match[str]) -> Step:
    if match.group(1) is not None:
        return int(match.group(1))
    raw = match.group(2) if match.group(2) is not None else match.group(3)
    return raw.replace("\\'", "'").replace('\\"', '"').replace("\\\\", "\\")


@lru_cache(maxsize=256)
def compiled_jsonpath(expression: str) -> Any:
    """JSONPath expressions are parsed once."""
    from jsonpath_ng.exceptions import JsonPathLexerError, JsonPathParserError
    from jsonpath_ng.ext import parse

    try:
        return parse(expression)
    except (JsonPathLexerError, JsonPathParserError, Exception) as exc:
        raise PathError(f"invalid JSONPath {expression!r}: {exc}") from None


def format_path(steps: list[Step]) -> str:
    out = ""
    for step in steps:
        if isinstance(step, int):
            out += f".{step}" if out else str(step)
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", step):
            out += f".{step}" if out else step
        else:
            out += f"[{json.dumps(step, ensure_ascii=False)}]"
    return out or "$"


def ijson_prefix(steps: list[str]) -> str:
    return ".".join(steps)


def step_into(value: Any, step: Step, where: list[Step]) -> Any:
    """One step into an in-memory value, with errors that say what is there instead."""
    here = format_path(where)
    if isinstance(step, int) and isinstance(value, dict) and str(step) in value:
        return value[str(step)]
    if isinstance(step, int):
        if not isinstance(value, list):
            raise PathError(f"{here} is {type_name(value)}, not an array; index {step} does not apply")
        if not -len(value) <= step < len(value):
            raise PathError(
                f"index {step} is out of range at {here}: the array has {len(value)} items (0..{len(value) - 1}, or -1 for the last)"
            )
        return value[step]
    if isinstance(value, list) and re.fullmatch(r"-?\d+", step):
        return step_into(value, int(step), where)
    if not isinstance(value, dict):
        raise PathError(f"{here} is {type_name(value)}, not an object; key {step!r} does not apply")
    if step not in value:
        keys = ", ".join(list(value)[:15])
        raise PathError(f"no key {step!r} at {here}; keys there: {keys}")
    return value[step]


def type_name(value: Any) -> str:
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    return "number"
