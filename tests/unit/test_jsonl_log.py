"""gateway.services.jsonl_log: every acknowledged append is on disk; torn and damaged lines are skipped."""

from pathlib import Path

from gateway.services.jsonl_log import JsonlLog


def test_append_read_and_resume_from_offset(tmp_path: Path) -> None:
    log = JsonlLog(tmp_path / "s.jsonl")
    log.append([{"id": 1, "text": "안녕"}])
    records, offset = log.read()
    assert records == [{"id": 1, "text": "안녕"}]
    assert "안녕" in log.path.read_text(encoding="utf-8")  # kept as written, no \\u escapes
    log.append(lambda: [{"id": 2}])  # a function is called under the lock
    more, _ = log.read(offset)
    assert more == [{"id": 2}]


def test_torn_last_line_is_skipped_and_never_glued_to_the_next(tmp_path: Path) -> None:
    log = JsonlLog(tmp_path / "s.jsonl")
    log.append([{"id": 1}])
    with open(log.path, "ab") as fh:
        fh.write(b'{"id": 2, "tex')  # a crash mid-write
    assert log.read()[0] == [{"id": 1}]
    log.append([{"id": 3}])
    assert [r["id"] for r in log.read()[0]] == [1, 3]


def test_damaged_middle_line_is_skipped(tmp_path: Path) -> None:
    log = JsonlLog(tmp_path / "s.jsonl")
    log.path.write_bytes(b'{"id": 1}\nnot json\n{"id": 3}\n')
    assert [r["id"] for r in log.read()[0]] == [1, 3]
