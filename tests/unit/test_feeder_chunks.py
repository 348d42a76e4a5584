"""A batch's result chunks: rewritten whole, assembled once per line, in input order."""

from __future__ import annotations

from pathlib import Path

import pytest

from carpool.backend.filestore import LocalFileStore
from feeder.chunks import assemble, chunk_name, drop_chunks, write_chunk
from feeder.run import stored_set


def test_an_unrecorded_chunk_is_written_over_and_a_stale_one_past_the_counter_ignored(
        tmp_path: Path) -> None:
    store = LocalFileStore(tmp_path)
    write_chunk(store, "b", 0, [(2, "two"), (0, "zero")], [(1, "one!")])
    write_chunk(store, "b", 1, [(3, "three")], [])  # a crash before its mark ...
    write_chunk(store, "b", 1, [(3, "three"), (4, "four")], [])  # ... then written again
    write_chunk(store, "b", 2, [(4, "four")], [])  # past the counter: never recorded
    assert assemble(store, "b", 2, "out") == b"zero\ntwo\nthree\nfour\n"
    assert assemble(store, "b", 2, "err") == b"one!\n"
    drop_chunks(store, "b", 2)
    assert store.get(chunk_name("b", "out", 2)) is None


def test_a_line_in_two_recorded_chunks_is_kept_once(tmp_path: Path) -> None:
    store = LocalFileStore(tmp_path)
    write_chunk(store, "b", 0, [(0, "first")], [])
    write_chunk(store, "b", 1, [(0, "again")], [])
    assert assemble(store, "b", 2, "out") == b"first\n"


def test_store_names_cannot_leave_the_folder(tmp_path: Path) -> None:
    store = LocalFileStore(tmp_path / "root")
    for name in ("../x", "/etc/passwd", "a//b", "a/./b", ""):
        with pytest.raises(ValueError):
            store.put(name, b"")


def test_stored_set_reads_redis_bit_order() -> None:
    assert stored_set(b"\x80\x01") == {0, 15}
    assert stored_set(b"") == set()


def test_the_local_store_says_whether_an_object_exists(tmp_path: Path) -> None:
    store = LocalFileStore(tmp_path)
    assert not store.exists("files/a")
    store.put("files/a", b"x")
    assert store.exists("files/a") and not store.exists("files")  # a folder is no object
    store.delete("files/a")
    assert not store.exists("files/a")
