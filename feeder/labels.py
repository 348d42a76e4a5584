"""What a bulk batch's result lines need of each input line besides its answer: its
``custom_id`` and (embeddings) its ``encoding_format`` and ``dimensions``.

Written once, at validation, as ``batches/<id>/labels`` in the file store (one JSON
list, ``[[custom_id, encoding_format, dimensions], ...]``, far smaller than the input;
a batch validated before ``dimensions`` was kept has pairs), and read
only when the input file is gone: then the lines that finished still go to the output
file, and every other line to the error file, each under its own ``custom_id``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from carpool.backend.filestore import FileStore
from carpool.intake.bulk_lines import Line


@dataclass(frozen=True)
class Label:
    #: None only when the labels are gone too (a batch validated before they were
    #: written): its lines are then named by their ``id`` alone.
    custom_id: str | None
    encoding_format: str
    dimensions: int | None = None


def labels_name(bulk_id: str) -> str:
    return f"batches/{bulk_id}/labels"


def of_lines(lines: Sequence[Line]) -> list[Label]:
    return [Label(line.custom_id, line.encoding_format, line.dimensions) for line in lines]


def write_labels(store: FileStore, bulk_id: str, lines: Sequence[Line]) -> None:
    data = json.dumps([[line.custom_id, line.encoding_format, line.dimensions]
                       for line in lines], separators=(",", ":"))
    store.put(labels_name(bulk_id), data.encode())


def read_labels(store: FileStore, bulk_id: str, total: int) -> list[Label]:
    """The ``total`` lines' labels; unknown ones (``custom_id`` None) when they are gone."""
    data = store.get(labels_name(bulk_id))
    rows = json.loads(data) if data else []
    if len(rows) != total:
        return [Label(None, "float") for _ in range(total)]
    return [Label(str(row[0]), str(row[1]), _dimensions(row[2:])) for row in rows]


def _dimensions(rest: list[object]) -> int | None:
    """The third element of a labels row: absent in a batch validated before it was."""
    return rest[0] if rest and isinstance(rest[0], int) else None


def drop_labels(store: FileStore, bulk_id: str) -> None:
    store.delete(labels_name(bulk_id))
