"""Offload: no upstream result larger than its limit reaches the model.

A result over `max_response_size` bytes or `max_response_tokens` tokens is written to the responses
store (`{workspace}/responses/`) and replaced by a small fileRef (`fileref`); the model explores the
file with response_outline / response_compress / response_slice / response_search (`explore`, over
`json_*` and `textfile`).
"""

from typing import Any

__all__ = ["OffloadPlugin"]


def __getattr__(name: str) -> Any:
    # imported when asked for: the SQL worker process (`sql_worker`) imports the loaders of this package
    # and nothing of the plugin (the MCP types and pydantic would add ~14 MB to every worker)
    if name == "OffloadPlugin":
        from plugins.offload.plugin import OffloadPlugin

        return OffloadPlugin
    raise AttributeError(name)
