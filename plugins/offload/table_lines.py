"""Any text result as the table `lines(n, text)`: one row per line, numbered as every other tool and
`grep -n` number them (a line ends at \\n; a \\r before it is not part of the text, a lone \\r is)."""

from __future__ import annotations

import codecs
import threading
from pathlib import Path
from typing import Any

from plugins.offload.tables import Table

_CHUNK = 1 << 20
# DuckDB's line reader also ends a row at a lone \r: it is hidden while reading, as U+FFFF (a
# noncharacter, which real text does not hold)
CR_STAND_IN = "\uffff"


def load(conn: Any, path: Path, scratch: Path, stop: threading.Event) -> Table:
    """`scratch` is a temporary file the loader may write (removed by the caller); `stop` ends the copy."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")  # as the other tools decode it
    with open(path, "rb") as src, open(scratch, "wb") as dst:
        while (block := src.read(_CHUNK)) and not stop.is_set():
            dst.write(decoder.decode(block).replace("\r", CR_STAND_IN).encode("utf-8", "surrogatepass"))
        dst.write(decoder.decode(b"", final=True).encode())
    conn.execute(
        "CREATE TABLE lines AS SELECT row_number() OVER () AS n, "
        "rtrim(replace(coalesce(text, ''), chr(65535), chr(13)), chr(13)) AS text FROM read_csv(?, "
        "columns={'text': 'VARCHAR'}, header=false, delim=chr(31), quote='', escape='', new_line='\\n', "
        "auto_detect=false, null_padding=true, strict_mode=false)",
        [str(scratch)],
    )
    return Table("lines", "text lines (n as grep -n counts them)")
