"""The document store keeps exactly the chunks of the last complete set of batches, in one transaction
(on SQLite and on PostgreSQL)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

import plugins.documents.plugin as plugin
from plugins.documents.chunker import Chunk, chunk_document, index_text
from plugins.documents.plugin import DocumentStore

TEXT = "# One\n\nfirst part text\n\n# Two\n\nsecond part 세션 getUserName\n"


def _batch(*names: str) -> tuple[list[Chunk], list[str]]:
    chunks = [Chunk(f"{n} body", n, i, 3) for i, n in enumerate(names)]
    return chunks, [index_text(c) for c in chunks]


def test_batches_are_stored_in_order_and_a_start_over_voids_the_earlier_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, storage: Any
) -> None:
    store = DocumentStore(tmp_path / "docs.sqlite", storage)
    monkeypatch.setattr(plugin, "chunk_batches", lambda text, kind: iter([_batch("a", "b"), _batch("c")]))
    info = store.put("d1", "t", "s", TEXT, "markdown")
    assert info["chunks"] == 3
    assert [c["text"] for c in store.chunks("d1", 0, 9)] == ["a body", "b body", "c body"]

    batches = [_batch("stale"), None, _batch("x", "y")]  # the worker failed after the first part went out
    monkeypatch.setattr(plugin, "chunk_batches", lambda text, kind: iter(batches))
    info = store.put("d2", "t", "s", TEXT + "changed", "markdown")
    assert info["chunks"] == 2 and info["outline"] == ["x", "y"]
    assert [c["text"] for c in store.chunks("d2", 0, 9)] == ["x body", "y body"]
    assert {h.key for h in store.index.search("stale", 10)} == set()
    assert {h.key for h in store.index.search("body", 10) if h.key.startswith("d2:")} == {"d2:0", "d2:1"}


def test_a_failure_while_storing_leaves_the_previous_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, storage: Any
) -> None:
    store = DocumentStore(tmp_path / "docs.sqlite", storage)
    store.put("d", "t", "s", TEXT, "markdown")
    before = store.chunks("d", 0, 99)
    assert [c["text"] for c in before] == [c.text for c in chunk_document(TEXT, "markdown")]

    def broken(text: str, kind: str):
        yield _batch("half")
        raise OSError("disk full")

    monkeypatch.setattr(plugin, "chunk_batches", broken)
    with pytest.raises(OSError):
        store.put("d", "t", "s", TEXT + "more", "markdown")
    assert store.chunks("d", 0, 99) == before  # the replace was rolled back whole


def test_the_store_is_not_locked_while_the_first_batch_is_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = DocumentStore(tmp_path / "docs.sqlite")
    seen: list[bool] = []

    def free_elsewhere() -> bool:  # the lock is re-entrant: ask from another thread
        result: list[bool] = []

        def probe() -> None:
            got = store.lock.acquire(blocking=False)
            if got:
                store.lock.release()
            result.append(got)

        thread = threading.Thread(target=probe)
        thread.start()
        thread.join()
        return result[0]

    def batches(text: str, kind: str):
        seen.append(free_elsewhere())  # a search could run while the document is chunked
        yield _batch("a")
        seen.append(free_elsewhere())  # the first part is being stored: one transaction, locked
        yield _batch("b")

    monkeypatch.setattr(plugin, "chunk_batches", batches)
    assert store.put("d", "t", "s", TEXT, "markdown")["chunks"] == 2
    assert seen == [True, False]


def test_two_gateways_ingesting_one_document_at_once_both_succeed(tmp_path: Path, storage: Any) -> None:
    """Two stores on one database (two replicas, or two gateways on one SQLite file) ingest the same
    document at the same moment, over and over: each answers without an error, and the document ends
    whole (the second sees the first, or replaces it)."""
    stores = [DocumentStore(tmp_path / "docs.sqlite", storage) for _ in range(2)]
    for round_ in range(5):
        text = "".join(f"# Part {i}\n\nround {round_} text of part {i} getUserName\n\n" for i in range(300))
        start = threading.Barrier(2)
        failures: list[BaseException] = []

        def ingest(
            store: DocumentStore, text: str = text, start: threading.Barrier = start, failures: list = failures
        ) -> None:
            start.wait()
            try:
                store.put("doc_same", "t", "inline", text, "markdown")
            except BaseException as exc:
                failures.append(exc)

        threads = [threading.Thread(target=ingest, args=(s,)) for s in stores]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not failures, failures
        info = stores[0].get("doc_same")
        assert info is not None and len(stores[1].chunks("doc_same", 0, 10_000)) == info["chunks"]
