"""Prometheus text exposition, read back in tests: families, and values by labels."""

from __future__ import annotations

from dataclasses import dataclass

import requests
from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Family:
    type: str
    labels: frozenset[str]  # without "le"


class Scrape:
    """One scrape: every carpool family and every sample (``_created`` left out)."""

    def __init__(self, text: str) -> None:
        self.families: dict[str, Family] = {}
        self.samples: list[tuple[str, dict[str, str], float]] = []
        for family in text_string_to_metric_families(text):
            # `<name>_created` (a counter's start time) reads back as a family of its own.
            if not family.name.startswith("carpool_") or family.name.endswith("_created"):
                continue
            name = family.name + ("_total" if family.type == "counter" else "")
            labels: set[str] = set()
            for s in family.samples:
                if s.name.endswith("_created"):
                    continue
                labels |= set(s.labels) - {"le"}
                self.samples.append((s.name, dict(s.labels), s.value))
            self.families[name] = Family(family.type, frozenset(labels))

    def value(self, name: str, **labels: str) -> float:
        """The sum of ``name``'s samples whose labels include ``labels``."""
        return sum(v for n, ls, v in self.samples
                   if n == name and all(ls.get(k) == x for k, x in labels.items()))

    def series(self, name: str) -> list[dict[str, str]]:
        return [ls for n, ls, _ in self.samples if n == name]


def scrape(url: str) -> Scrape:
    r = requests.get(url, timeout=10)
    r.raise_for_status()
    assert r.headers["Content-Type"].startswith("text/plain")
    return Scrape(r.text)
