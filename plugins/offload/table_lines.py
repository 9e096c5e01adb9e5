"""Any text result as the table `lines(n, text)`: one row per line, numbered as every other tool and
`grep -n` number them (a line ends at \\n; a \\r before it is not part of the text, a lone \\r is)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from plugins.offload.tables import Table

_CHUNK = 1 << 20
CR_STAND_IN = b"\x1e"  # DuckDB's line reader also ends a row at a lone \r: it is hidden while reading


def load(conn: Any, path: Path, scratch: Path) -> Table:
    """`scratch` is a temporary file the loader may write (removed by the caller)."""
    with open(path, "rb") as src, open(scratch, "wb") as dst:
        while block := src.read(_CHUNK):
            dst.write(block.replace(b"\r", CR_STAND_IN))
    conn.execute(
        "CREATE TABLE lines AS SELECT row_number() OVER () AS n, "
        "rtrim(replace(coalesce(text, ''), chr(30), chr(13)), chr(13)) AS text FROM read_csv(?, "
        "columns={'text': 'VARCHAR'}, header=false, delim=chr(31), quote='', escape='', new_line='\\n', "
        "auto_detect=false, null_padding=true, strict_mode=false)",
        [str(scratch)],
    )
    return Table("lines", "text lines (n as grep -n counts them)")
