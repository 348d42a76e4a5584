"""A batch's labels (feeder/labels.py): what its result lines need of each input line
when the input file is gone, read back as written, and as older batches wrote them."""

from __future__ import annotations

import json
from pathlib import Path

from carpool.backend.filestore import LocalFileStore
from carpool.intake.bulk_lines import Line
from feeder.labels import Label, labels_name, read_labels, write_labels


def test_labels_read_back_as_written_dimensions_included(tmp_path: Path) -> None:
    store = LocalFileStore(tmp_path)
    lines = [Line(0, "a", (), "float", 8), Line(1, "b", (), "base64")]
    write_labels(store, "batch_1", lines)
    assert read_labels(store, "batch_1", 2) == [Label("a", "float", 8),
                                                 Label("b", "base64", None)]


def test_labels_written_before_dimensions_was_kept_read_as_asking_for_none(
        tmp_path: Path) -> None:
    store = LocalFileStore(tmp_path)
    store.put(labels_name("batch_1"), json.dumps([["a", "float"], ["b", "base64"]]).encode())
    assert read_labels(store, "batch_1", 2) == [Label("a", "float"), Label("b", "base64")]
