"""Every test file lives in the folder of what it needs (tests/conftest.py says which
needs what); tests/ itself holds only the shared conftest and the support package."""

from __future__ import annotations

from tests.conftest import KINDS, TESTS, kind_of

#: What tests/ may hold besides the kind folders (caches aside).
ROOT_ENTRIES = {"__init__.py", "conftest.py", "support", *KINDS}


def test_every_test_file_lives_in_one_of_the_kind_folders() -> None:
    misplaced = [str(p.relative_to(TESTS)) for p in TESTS.rglob("test_*.py")
                 if kind_of(p) is None]
    assert misplaced == []


def test_the_tests_root_holds_only_the_conftest_and_the_support_package() -> None:
    extra = {p.name for p in TESTS.iterdir()
             if p.name not in ROOT_ENTRIES and p.name != "__pycache__"}
    assert extra == set()

