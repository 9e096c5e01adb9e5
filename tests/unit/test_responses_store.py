"""gateway.services.responses: saved results resolve by id or path, and nothing outside the folder does."""

import base64
import os
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
