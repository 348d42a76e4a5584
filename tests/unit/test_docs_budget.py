"""The user documents stay short enough to read, say what is true now, and link to
places that exist: docs/ within a character budget, no project-status talk in it,
and every relative link of the docs, the README and the changelog resolving to a
file (and to a heading, when it names one)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
#: What a newcomer can read in an afternoon; room is left under it for additions.
DOCS_BUDGET_CHARS = 150_000
#: One document longer than this is several documents, or a history.
DOC_BUDGET_CHARS = 30_000
#: Phrases that report on the project (its goals, its to-do list, its tracker) rather
#: than on carpool. Matched case-insensitively as whole phrases.
STATUS_PHRASES = ("goal is not met", "goal was not met", "is not met", "are not met",
                  "todo", "fixme", "the issue", "not yet measured", "still to be measured")
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def user_docs() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def test_the_docs_fit_the_character_budget() -> None:
    sizes = {doc.name: len(doc.read_text()) for doc in user_docs()}
    assert sum(sizes.values()) <= DOCS_BUDGET_CHARS, (
        f"docs/ holds {sum(sizes.values())} characters, over {DOCS_BUDGET_CHARS}: {sizes}")


@pytest.mark.parametrize("doc", user_docs(), ids=lambda p: p.name)
def test_no_doc_is_longer_than_one_reading(doc: Path) -> None:
    size = len(doc.read_text())
    assert size <= DOC_BUDGET_CHARS, f"{doc.name} holds {size} characters"


@pytest.mark.parametrize("doc", user_docs(), ids=lambda p: p.name)
def test_no_doc_talks_about_the_project_status(doc: Path) -> None:
    text = doc.read_text().lower()
    found = [p for p in STATUS_PHRASES if re.search(rf"\b{re.escape(p)}\b", text)]
    assert not found, f"{doc.name} reports on the project, not on carpool: {found}"


def anchors(doc: Path) -> set[str]:
    """GitHub's ids for the headings of ``doc``."""
    ids = set()
    for line in doc.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            ids.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return ids


@pytest.mark.parametrize("doc", [ROOT / "README.md", ROOT / "CHANGELOG.md", *user_docs()],
                         ids=lambda p: p.name)
def test_every_relative_link_resolves(doc: Path) -> None:
    broken = []
    for target in _LINK.findall(doc.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not ours to check
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(target)
    assert not broken, f"{doc.name} links to what does not exist: {broken}"
