"""Documents: material far larger than the window, read in targeted pieces.

doc_ingest chunks a file (below `ingest_roots` only) or inline text by its structure; doc_search
finds chunks with FTS5 BM25 (the same identifier and CJK handling as memory); doc_window reads
consecutive chunks. Offloaded text results are documents too: pass their resp_ id.
"""

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    # The plugin loads on first use, so a worker process that only chunks (`chunker`) imports just
    # what chunking needs (0.15 s instead of 0.64 s).
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(importlib.import_module("plugins.documents.plugin"), name)
