"""Offload: no upstream result larger than its limit reaches the model.

A result over `max_response_size` bytes or `max_response_tokens` tokens is written to the responses
store (`{workspace}/responses/`) and replaced by a small fileRef (`fileref`); the model explores the
file with response_outline / response_compress / response_slice / response_search (`explore`, over
`json_*` and `textfile`).
"""

from plugins.offload.plugin import OffloadPlugin

__all__ = ["OffloadPlugin"]
