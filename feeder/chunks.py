"""A bulk batch's results in the file store: chunks as lines end, two files at the end.

Chunk ``n`` of a batch is a pair of objects, ``batches/<id>/out-<n>`` and
``err-<n>``, each line ``<line index>\\t<output line>``. The feeder writes chunk n
(both objects, even when one is empty), then records in Redis, in one MULTI, that
its lines are stored and that the next chunk is n + 1. A crash between the two
leaves chunk n unrecorded: its lines are not marked, so they go into the next
chunk n, written over it. The files are then made from chunks 0..n-1 only
(the counter in Redis), deduplicated by line index: a line is in exactly one file,
never twice, whatever crashed when.
"""

from __future__ import annotations

from collections.abc import Sequence

from carpool.backend.filestore import FileStore


def chunk_name(bulk_id: str, part: str, n: int) -> str:
    return f"batches/{bulk_id}/{part}-{n:06d}"


def write_chunk(store: FileStore, bulk_id: str, n: int,
                out: Sequence[tuple[int, str]], err: Sequence[tuple[int, str]]) -> None:
    for part, rows in (("out", out), ("err", err)):
        store.put(chunk_name(bulk_id, part, n),
                  "".join(f"{i}\t{text}\n" for i, text in rows).encode())


def assemble(store: FileStore, bulk_id: str, chunks: int, part: str) -> bytes:
    """The file of one part (out or err): each line once, in input order."""
    rows: dict[int, str] = {}
    for n in range(chunks):
        data = store.get(chunk_name(bulk_id, part, n)) or b""
        for row in data.decode().splitlines():
            index, _, text = row.partition("\t")
            rows.setdefault(int(index), text)
    return "".join(rows[i] + "\n" for i in sorted(rows)).encode()


def drop_chunks(store: FileStore, bulk_id: str, chunks: int) -> None:
    for n in range(chunks + 1):  # +1: an unrecorded chunk left by a crash
        for part in ("out", "err"):
            store.delete(chunk_name(bulk_id, part, n))
