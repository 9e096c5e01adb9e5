"""Reading tool arguments: wrong types and missing values become clear messages, never tracebacks.

Hosts do not enforce input schemas, so every gateway-owned tool reads its arguments through this.
"""

from __future__ import annotations

from typing import Any


class ToolInputError(ValueError):
    """Bad arguments; the message tells the model what to send instead."""


_MISSING = object()


class Args:
    def __init__(self, arguments: Any, tool: str):
        if not isinstance(arguments, dict):
            raise ToolInputError(f"{tool}: arguments must be an object")
        self.raw = arguments
        self.tool = tool

    def _get(self, name: str, default: Any, required: bool) -> Any:
        value = self.raw.get(name, _MISSING)
        if value is _MISSING or value is None:
            if required:
                raise ToolInputError(f"{self.tool}: `{name}` is required")
            return default
        return value

    def str(self, name: str, default: str | None = None, *, required: bool = False, max_len: int = 1_000_000) -> Any:
        value = self._get(name, default, required)
        if value is default and not required:
            return value
        if not isinstance(value, str):
            raise ToolInputError(f"{self.tool}: `{name}` must be a string, got {type(value).__name__}")
        if required and not value.strip():
            raise ToolInputError(f"{self.tool}: `{name}` must not be empty")
        if len(value) > max_len:
            raise ToolInputError(f"{self.tool}: `{name}` is longer than {max_len} characters")
        return value

    def int(
        self,
        name: str,
        default: int | None = None,
        *,
        lo: int | None = None,
        hi: int | None = None,
        required: bool = False,
    ) -> Any:
        value = self._get(name, default, required)
        if value is None:
            return None
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ToolInputError(f"{self.tool}: `{name}` must be a whole number, got {value!r}")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            bounds = (
                f"between {lo} and {hi}"
                if lo is not None and hi is not None
                else (f"at least {lo}" if lo is not None else f"at most {hi}")
            )
            raise ToolInputError(f"{self.tool}: `{name}` must be {bounds}, got {value}")
        return value

    def bool(self, name: str, default: bool = False) -> bool:
        value = self._get(name, default, False)
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        if not isinstance(value, bool):
            raise ToolInputError(f"{self.tool}: `{name}` must be true or false, got {value!r}")
        return value

    def choice(self, name: str, choices: tuple[str, ...], default: str | None = None) -> Any:
        value = self.str(name, default, required=default is None)
        if value not in choices:
            raise ToolInputError(f"{self.tool}: `{name}` must be one of {', '.join(choices)}; got {value!r}")
        return value

    def str_list(self, name: str, *, required: bool = False) -> list[str]:
        value = self._get(name, [], required)
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ToolInputError(f"{self.tool}: `{name}` must be a list of strings")
        if required and not value:
            raise ToolInputError(f"{self.tool}: `{name}` must list at least one value")
        return value
