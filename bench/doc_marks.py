"""Figures in the docs between markers, written from a result JSON and checked against it.

A block of lines (docs/simulator.md's "how close" figures) stands between :func:`doc_block`'s markers and
is rewritten whole (:func:`write_doc_block`). A figure inside a sentence or table (the peers' and the
weighting evidence's) shows as ``<!--KIND NAME-->value<!--/KIND-->``: ``KIND`` names the benchmark whose
JSON the value comes from (``peers``, ``weighting``), ``NAME`` the figure. The benchmark's report writes
every marked value (:func:`fill`); ``tests/test_findings_drift.py`` recomputes them from the committed JSON
and fails on one that differs (:func:`marked`), so README.md and docs/ cannot drift from the results.
"""

from __future__ import annotations

import re
from pathlib import Path

from bench.harness import REPO

DOCS = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))


def doc_block(name: str) -> tuple[str, str]:
    """The markers around a block of a doc that a benchmark writes from its JSON (``name``: the benchmark)."""
    return (f"<!-- {name}: generated from bench/results/{name}.json by bench/{name}.py -->",
            f"<!-- /{name} -->")


def write_doc_block(doc: Path, name: str, text: str) -> bool:
    """Replace the text between ``name``'s markers in ``doc`` (docs/simulator.md's "how close" figures) with
    ``text``; False (and nothing written) where the doc has no such block."""
    begin, end = doc_block(name)
    body = doc.read_text()
    if begin not in body or end not in body:
        return False
    head, rest = body.split(begin, 1)
    doc.write_text(head + begin + "\n" + text.rstrip("\n") + "\n" + end + rest.split(end, 1)[1])
    return True


def read_doc_block(doc: Path, name: str) -> str | None:
    """The text between ``name``'s markers in ``doc`` (None: no block)."""
    begin, end = doc_block(name)
    body = doc.read_text()
    if begin not in body or end not in body:
        return None
    return body.split(begin, 1)[1].split(end, 1)[0].strip("\n")


def pattern(kind: str) -> re.Pattern:
    return re.compile(rf"<!--{kind} (?P<key>\w+)-->(?P<value>.*?)<!--/{kind}-->", re.S)


def marked(kind: str, paths: tuple[Path, ...] = DOCS) -> list[tuple[Path, str, str]]:
    """Every ``(doc, figure name, value shown)`` of ``kind`` in ``paths``."""
    mark = pattern(kind)
    return [(p, m["key"], m["value"]) for p in paths for m in mark.finditer(p.read_text())]


def fill(kind: str, figures: dict[str, str], paths: tuple[Path, ...] = DOCS) -> int:
    """Write ``figures`` between the ``kind`` markers of ``paths``; how many were written. A marker naming a
    figure that ``figures`` lacks stops with one line naming the doc and the figure."""
    mark = pattern(kind)
    n = 0
    for path in paths:
        text = path.read_text()
        unknown = sorted({m["key"] for m in mark.finditer(text)} - set(figures))
        if unknown:
            raise SystemExit(f"{kind}: {path}: unknown figure(s) {', '.join(unknown)}; expected one of "
                             f"{', '.join(figures)}")  # fmt: skip
        new, k = mark.subn(lambda m: f"<!--{kind} {m['key']}-->{figures[m['key']]}<!--/{kind}-->", text)
        if new != text:
            path.write_text(new)
        n += k
    return n
