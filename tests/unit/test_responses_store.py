"""gateway.services.responses: saved results resolve by id or path, and nothing outside the folder does."""

import base64
import os
import time
from pathlib import Path

import pytest

from gateway.services.responses import ResponseStore, StoreError, id_of, saved_kind


def test_save_and_resolve(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path / "responses")
    saved = store.save_text("fs__read", '{"a": "세션"}', "json")
    assert saved.path.read_text(encoding="utf-8") == '{"a": "세션"}' and saved.size == len('{"a": "세션"}'.encode())
    assert store.resolve(saved.id) == saved.path and id_of(saved.path) == saved.id
    assert store.resolve(saved.path.name) == saved.path.resolve()
    image = store.save_base64("shot", base64.b64encode(b"\x89PNG...").decode(), "image/png")
    assert image.path.suffix == ".png" and image.path.read_bytes() == b"\x89PNG..."
    assert [saved_kind(p.path) for p in (saved, image)] == ["json", "binary"]
    assert saved_kind(Path("x.log")) == "text"
    assert not [p for p in store.folder.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("ref", ["resp_00000000", "../secret.txt", "/etc/passwd", "a\x00b", "", 5])
def test_refusals_list_what_exists(tmp_path: Path, ref: object) -> None:
    store = ResponseStore(tmp_path / "responses")
    saved = store.save_text("t", "x", "text")
    (tmp_path / "secret.txt").write_text("no")
    with pytest.raises(StoreError) as err:
        store.resolve(ref)
    assert "\x00" in str(ref) or saved.id in str(err.value)


def test_symlink_out_of_the_folder_is_refused(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path / "responses")
    store.save_text("t", "x", "text")
    (tmp_path / "secret.txt").write_text("no")
    os.symlink(tmp_path / "secret.txt", store.folder / "link-deadbeef.txt")
    with pytest.raises(StoreError, match="outside the response workspace"):
        store.resolve("link-deadbeef.txt")


def test_expiry_and_clear(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path / "responses")
    old, new = store.save_text("old", "x", "text"), store.save_text("new", "y", "text")
    os.utime(old.path, (0, 0))
    assert store.remove_older_than(48) == 1 and not old.path.exists() and new.path.exists()
    assert store.clear() == 1 and not list(store.folder.iterdir())


def test_the_open_command_names_the_hosts_side_of_a_bind_mount(tmp_path: Path) -> None:
    """In a container the workspace is /data; the host opens the file where it mounted that folder."""
    from gateway.services.responses import seen_on_host

    workspace = tmp_path / "data"
    folder = workspace / "ns" / "alice" / "responses"
    for host, expected in [
        ("/home/me/gw", "xdg-open /home/me/gw/ns/alice/responses/x-1.json"),
        ("/Users/me/gw", "open /Users/me/gw/ns/alice/responses/x-1.json"),
        ("C:\\Users\\me\\gw", 'start "" "C:\\Users\\me\\gw\\ns\\alice\\responses\\x-1.json"'),
    ]:
        store = ResponseStore(folder, seen_on_host(host, workspace, folder))
        assert store.open_command(folder / "x-1.json") == expected
    assert ResponseStore(folder).open_command(folder / "x-1.json").endswith(str(folder / "x-1.json"))


def test_two_replicas_sweeping_one_shared_folder_at_once(tmp_path: Path) -> None:
    """Replicas share the workspace folder and each sweeps old results at start: run together, they
    remove every old file between them, keep every new one, and neither fails on a file the other took."""
    import threading
    import time

    a, b = ResponseStore(tmp_path), ResponseStore(tmp_path)
    old = [a.save_text(f"old{i}", "x" * 100, "text").path for i in range(300)]
    hour_ago = time.time() - 7200
    for path in old:
        os.utime(path, (hour_ago, hour_ago))
    new = [b.save_text(f"new{i}", "y", "text").path for i in range(20)]
    removed: list[int] = []
    errors: list[BaseException] = []

    def sweep(store: ResponseStore) -> None:
        try:
            removed.append(store.remove_older_than(1))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=sweep, args=(s,)) for s in (a, b, a, b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and sum(removed) == len(old)  # each file counted once, by whoever took it
    assert not any(p.exists() for p in old) and all(p.exists() for p in new)


def dead_writer() -> str:
    """The writer tag of a process of this host that has ended (a gateway killed mid-write)."""
    import subprocess

    from gateway.services.files import writer_tag

    child = subprocess.Popen(["true"])
    child.wait()
    return f"{child.pid}~{writer_tag().split('~')[1]}"


def left_by(writer: str, path: Path) -> Path:
    """`path`, a temp name this process made, as the writer `writer` would have named it."""
    from gateway.services.files import writer_tag

    return path.with_name(path.name.replace(writer_tag(), writer))


def test_the_start_sweep_removes_every_temp_a_dead_writer_left_files_and_folders(tmp_path: Path) -> None:
    """A gateway killed while it converted a result leaves its scratch pieces (`.tmp.N`), DuckDB's file,
    log and spill folder; a query stopped at its limit leaves `.<result>.duckdb.tmp/`. All go at the next
    start (a folder was an IsADirectoryError that kept offload from starting); a live writer's temp files,
    a young spill folder another gateway may be using, and saved results stay; symlinks are never followed."""
    from gateway.services.files import temp_beside

    store = ResponseStore(tmp_path / "responses")
    saved = store.save_text("fs__read", "x" * 100, "text").path
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("not the gateway's")
    dead = dead_writer()
    scratch = left_by(dead, temp_beside(saved, "scratch"))
    duck = left_by(dead, temp_beside(saved, "duckdb"))
    leftovers = [scratch, scratch.with_name(scratch.name + ".1"), scratch.with_name(scratch.name + ".12"), duck]
    leftovers.append(duck.with_name(duck.name + ".wal"))
    for path in leftovers:
        path.write_text("partial")
    spill = duck.with_name(duck.name + ".tmp")  # DuckDB's spill folder of the conversion
    (spill / "deep").mkdir(parents=True)
    (spill / "deep" / "duckdb_temp_block-1.block").write_bytes(b"\0" * 1000)
    (spill / "link").symlink_to(outside, target_is_directory=True)
    stopped = saved.with_name(f".{saved.name}.duckdb.tmp")  # a query's spill folder, untouched for an hour
    stopped.mkdir()
    (stopped / "duckdb_temp_storage-0.tmp").write_bytes(b"\0" * 1000)
    hour_ago = time.time() - 3600
    os.utime(stopped, (hour_ago, hour_ago))
    link = left_by(dead, temp_beside(saved, "linked"))  # a symlink with a temp name: the link goes, not its target
    link.symlink_to(outside, target_is_directory=True)
    live = temp_beside(saved)  # this process writes it now
    live.write_text("in progress")
    young = tmp_path / "responses" / ".other-00000001.json.duckdb.tmp"  # another gateway's query spills now
    young.mkdir()

    assert store.remove_stale_temp_files() == len(leftovers) + 3
    assert not any(p.exists() or p.is_symlink() for p in [*leftovers, spill, stopped, link])
    assert sorted(p.name for p in store.folder.iterdir()) == sorted([saved.name, live.name, young.name])
    assert (outside / "keep.txt").read_text() == "not the gateway's"


def test_the_ttl_sweep_removes_old_folders_and_links_never_what_they_point_to(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path / "responses")
    new = store.save_text("new", "y", "text").path
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("kept")
    folder = store.folder / ".old-00000001.json.duckdb.tmp"
    folder.mkdir()
    (folder / "block").write_text("old")
    (folder / "out").symlink_to(outside, target_is_directory=True)
    link = store.folder / "link-00000002.txt"
    link.symlink_to(outside / "keep.txt")
    three_days_ago = time.time() - 3 * 86400
    for path in (folder, link):
        os.utime(path, (three_days_ago, three_days_ago), follow_symlinks=False)
    assert store.remove_older_than(48) == 2
    assert [p.name for p in store.folder.iterdir()] == [new.name]
    assert (outside / "keep.txt").read_text() == "kept"


def immutable(path: Path, on: bool = True) -> bool:
    """Make `path` unremovable even by root (`chattr +i`); False where the file system cannot."""
    import subprocess

    try:
        done = subprocess.run(["chattr", "+i" if on else "-i", str(path)], capture_output=True)
    except OSError:
        return False
    return done.returncode == 0


def test_an_entry_that_will_not_go_is_logged_in_one_line_and_the_sweep_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = ResponseStore(tmp_path / "responses")
    store.ensure()
    stuck = store.folder / ".r-00000001.json.duckdb.tmp"
    stuck.mkdir()
    (stuck / "pinned").write_text("x")
    (stuck / "loose").write_text("x")
    if not immutable(stuck / "pinned"):
        pytest.skip("no immutable files here (chattr)")
    try:
        other = store.folder / ".s-00000002.json.duckdb.tmp"
        other.mkdir()
        for path in (stuck, other):
            os.utime(path, (0, 0))
        with caplog.at_level("WARNING"):
            assert store.remove_stale_temp_files() == 1 and not other.exists()
        assert not (stuck / "loose").exists()  # what could go went
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(warnings) == 1 and "pinned" in warnings[0] and "\n" not in warnings[0]
    finally:
        immutable(stuck / "pinned", on=False)


def test_a_temp_name_with_a_pid_past_any_pid_is_a_dead_writers(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path)
    odd = tmp_path / ".r-00000001.json.99999999999999999999999.1.tmp"
    odd.write_text("x")
    assert store.remove_stale_temp_files() == 1 and not odd.exists()


def test_a_results_tables_go_with_the_result_not_before_it(tmp_path: Path) -> None:
    """A young result whose tables file is old (shared with an earlier result, whose time it keeps): the
    expiry keeps the file while the result stays, and removes an old result's with it."""
    store = ResponseStore(tmp_path / "responses")
    old, young = store.save_text("old", "x", "json"), store.save_text("young", "x", "json")
    tables = {saved.path.with_name(f".{saved.path.name}.duckdb") for saved in (old, young)}
    for path in tables:
        path.write_bytes(b"tables")
    long_ago = time.time() - 3 * 86400
    for path in (old.path, *tables):
        os.utime(path, (long_ago, long_ago))
    assert store.remove_older_than(48) == 2
    assert sorted(p.name for p in store.folder.iterdir()) == sorted([young.path.name, f".{young.path.name}.duckdb"])
