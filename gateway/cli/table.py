"""Plain-text tables for the commands that print them (`inspect`, `stats`)."""

from __future__ import annotations


def table(rows: list[list[str]], right: set[int] | frozenset[int] = frozenset()) -> str:
    """Columns padded to their widest cell (the `right` ones right-aligned: figures), a rule under the header."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]

    def cell(i: int, text: str) -> str:
        return text.rjust(widths[i]) if i in right else text.ljust(widths[i])

    lines = ["  ".join(cell(i, c) for i, c in enumerate(r)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
