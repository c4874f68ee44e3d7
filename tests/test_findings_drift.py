"""Every number in the findings and results markdown of bench/results/ comes from its JSON (issue 35 item 3).

Each markdown file is checked against the JSON files its numbers come from (``SOURCES``). A number is
read with the decimals it shows and matches a JSON value that rounds to it (values in [0, 1] also as
percentages; signs are prose's, so magnitudes are compared). Some contexts are typed, because a bare
match among a thousand values proves little:

- ``A ± B`` must be one object's ``mean`` and ``sd``, and ``A ± B (+-++)`` one object's ``mean``, ``sd``
  and ``signs``;
- a number after ``Holm`` or ``adjusted p`` must be a ``holm_p``, and ``p X.XX`` (two decimals or more)
  a ``t_test_p`` or ``holm_p``;
- a bracketed sign string such as ``(++-++)`` must be one of the JSON's ``signs``.

Every other number must match some value of the sources: a weaker check (with a thousand values a wrong
one-decimal number can meet some other value), so a number that matters is best written in a typed
context. Numbers that are not results (settings such as 80-15-5, seeds, code and file names) are stripped
first; the few left that the JSON cannot carry are in ``ALLOWED`` with the reason. A generated file
(factorial.md, head_update.md) is checked when present.

README.md and docs/ (issue 44 item 3): the passages that report the paper tables' results
(``DOC_SECTIONS``) get the same check, and every figure marked ``<!--KIND NAME-->value<!--/KIND-->``
(bench/doc_marks.py: ``peers``, ``weighting``, ``head_update``) must be exactly what its benchmark's report
computes from the committed JSON now.
"""

from __future__ import annotations

import bisect
import json
import re
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"

SOURCES: dict[str, tuple[str, ...]] = {
    "table1_findings.md": ("table1.json", "table1_rerun.json", "table1_dev.json", "budget_curve.json"),
    "table1.md": ("table1.json", "table1_rerun.json", "table1_dev.json", "budget_curve.json"),
    "table1_dev.md": ("table1_dev.json",),
    "table1_rerun.md": ("table1_rerun.json",),
    "table2_findings.md": ("table2.json", "table2_diagnostics.json", "table2_diagnostics_seed6.json"),
    "table2.md": ("table2.json", "table2_diagnostics.json", "table2_diagnostics_seed6.json"),
    "table2_diagnostics_findings.md": ("table2_diagnostics.json",),
    "table2_diagnostics.md": ("table2_diagnostics.json",),
    "table2_diagnostics_seed6_findings.md": ("table2_diagnostics_seed6.json",),
    "table2_diagnostics_seed6.md": ("table2_diagnostics_seed6.json",),
    "budget_curve_findings.md": ("budget_curve.json", "table1.json", "table1_rerun.json"),
    "budget_curve.md": ("budget_curve.json", "table1.json", "table1_rerun.json"),
    "factorial.md": ("factorial.json",),
    "head_update.md": ("head_update.json",),
}
GENERATED = ("factorial.md", "head_update.md")  # written by their scripts: checked when a campaign produced them

# Numbers that are not results and that no JSON holds, per file: the string as written, and why.
ALLOWED: dict[str, dict[str, str]] = {
    "*": {
        "0.0625": "the two-sided sign test's floor at 5 seeds, 2 / 2^5",
        "3,000": "the larger-scale cells' test set (their scale, gpu_check.md), not a result",
        "11,800": "the authors' runs' root SGD steps, 118 a round x 100 rounds (gpu_check.md), a design figure",
        "9.5": "a paper-scale run's minutes on an H100 (gpu_check.md), a cost estimate",
        "0.125": "the reduced scale's ResNet-18 width (Table 1's), a setting",
    },
    "budget": {  # x8's planned scale (budget_curve.py BUDGETS): defined, not run
        "32,000": "x8's training images",
        "2,500": "x8's estimated root SGD steps",
        "8.4": "x8's estimated steps ratio to x1",
    },
    "table2": {  # the highly biased partition and line 12's coefficient for its root (design, docs/training.md)
        "5,369": "the root's share of 7,000 images under the highly biased partition",
        "77": "the same share in per cent",
        "3.07": "line 12's coefficient of the root drawing exit 1 at p = 0.2: 0.8 x 0.767 / 0.2",
        "60": "rounds per run (the scale)",
        "7,000": "training images (the scale)",
    },
}
ALLOWED_GROUP = {  # which ALLOWED group besides "*" a file may use
    "budget_curve_findings.md": "budget",
    "budget_curve.md": "budget",
    "table2_findings.md": "table2",
    "table2.md": "table2",
    "table2_diagnostics_findings.md": "table2",
    "table2_diagnostics.md": "table2",
    "table2_diagnostics_seed6_findings.md": "table2",
    "table2_diagnostics_seed6.md": "table2",
}

# Not results: code spans, links, file names, serving settings (80-15-5), model and machine names.
STRIP = (
    r"`[^`]*`",
    r"\]\([^)]*\)",
    r"\S+\.(?:md|json|py|png|sh)\b",
    r"\b\d+-\d+-\d+\b",
    r"\b(?:ResNet|CIFAR|paper)-\d+\b",
    r"\b[HA]\d{2,3}\b",
    r"\b(?:issue|issues|Table|Theorem|line|lines|Algorithm|exit|exits|stage|head|x)\s?\d+(?:[-/,]\d+)*\b",
    r"\bseeds? \d+(?:\s?[-,]\s?\d+)*\b",
    r"\bsession \d+\b",
    r"\b95 % CI\b",
    r"<!--(\w+) \w+-->.*?<!--/\1-->",  # a marked figure: checked whole against its JSON (doc_marks)
)
NUMBER = re.compile(r"(?<![\w.])[+\-−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\w.]\d)")
PAIR = re.compile(r"([+\-−]?\d+(?:\.\d+)?) ± (\d+(?:\.\d+)?)(?:\*\*)?(?: \(([+\-0]{2,})[),])?")
HOLM = re.compile(r"(?:Holm|adjusted p)(?: p)?(?: =)?(?: over [a-z ]{0,40})? (\d\.\d+)(?:\s?[-–]\s?(\d\.\d+))?")
P_VALUE = re.compile(r"(?<!Holm )(?<!adjusted )\bp (?:= )?(\d\.\d{2,})")
SIGNS = re.compile(r"\(([+\-0]{3,})[),]")


def walk(x, path: tuple = ()):
    """(key path, value) of every number in a JSON document, skipping the embedded findings text."""
    if isinstance(x, dict):
        for k, v in x.items():
            if k != "findings":
                yield from walk(v, (*path, k))
    elif isinstance(x, list):
        for v in x:
            yield from walk(v, path)
    elif isinstance(x, (int, float)) and not isinstance(x, bool):
        yield path, float(x)


def objects(x):
    """Every JSON object of a document."""
    if isinstance(x, dict):
        yield x
        for k, v in x.items():
            if k != "findings":
                yield from objects(v)
    elif isinstance(x, list):
        for v in x:
            yield from objects(v)


class Pool:
    """What a markdown file's numbers may match: the values of its JSON sources, by kind."""

    def __init__(self, docs: list) -> None:
        self.values: list[float] = []
        self.holm: list[float] = []
        self.pvalues: list[float] = []
        self.pairs: list[tuple[float, float, str | None]] = []
        self.signs: set[str] = set()
        for doc in docs:
            for path, v in walk(doc):
                self.values += [v, 100 * v] if abs(v) <= 1 else [v]
                key = path[-1] if path else ""
                if key == "holm_p":
                    self.holm.append(v)
                if key in ("holm_p", "t_test_p", "p"):
                    self.pvalues.append(v)
            for o in objects(doc):
                if isinstance(o.get("mean"), (int, float)) and isinstance(o.get("sd"), (int, float)):
                    signs = o.get("signs") if isinstance(o.get("signs"), str) else None
                    self.pairs.append((float(o["mean"]), float(o["sd"]), signs))
                    if abs(o["mean"]) <= 1 and abs(o["sd"]) <= 1:
                        self.pairs.append((100 * float(o["mean"]), 100 * float(o["sd"]), signs))
                if isinstance(o.get("signs"), str):
                    self.signs.add(o["signs"])
        self.sorted = sorted({abs(v) for v in self.values})


    def has(self, text: str) -> bool:
        """Whether some value shows as ``text`` (its magnitude, at its decimals)."""
        x, half = abs(number_of(text)), 0.5 * 10 ** -decimals(text) + 1e-9
        k = bisect.bisect_left(self.sorted, x - half)
        return k < len(self.sorted) and self.sorted[k] <= x + half


def number_of(text: str) -> float:
    return float(text.replace("−", "-").replace(",", ""))


def decimals(text: str) -> int:
    return len(text.split(".")[1]) if "." in text else 0


def shows(value: float, text: str) -> bool:
    """Whether ``value`` written with ``text``'s decimals is ``text`` (magnitudes; either rounding at a tie)."""
    x = number_of(text)
    return abs(abs(value) - abs(x)) <= 0.5 * 10 ** -decimals(text) + 1e-9


def strip(text: str) -> str:
    for pattern in STRIP:
        text = re.sub(pattern, " ", text)
    return text


def unmatched(text: str, pool: Pool, allowed: dict[str, str]) -> list[str]:
    """The numbers of ``text`` that its JSON cannot carry, each with its context."""
    text = strip(text)
    bad: list[str] = []

    def where(m: re.Match) -> str:
        return " ".join(text[max(0, m.start() - 50) : m.end() + 15].split())

    typed: set[int] = set()  # start offsets of numbers a typed rule has judged
    for m in PAIR.finditer(text):
        a, b, signs = m.group(1), m.group(2), m.group(3)
        typed |= {m.start(1), m.start(2)}
        if not any(shows(mu, a) and shows(sd, b) and signs in (None, s) for mu, sd, s in pool.pairs):
            what = "mean ± sd (signs)" if signs else "mean ± sd"
            bad.append(f"'{m.group(0)}' is no {what} of the JSON: ...{where(m)}...")
    for m in HOLM.finditer(text):
        for g in (1, 2):
            if m.group(g) is None:
                continue
            typed.add(m.start(g))
            if m.group(g) not in allowed and not any(shows(v, m.group(g)) for v in pool.holm):
                bad.append(f"Holm p '{m.group(g)}' is no holm_p of the JSON: ...{where(m)}...")
    for m in P_VALUE.finditer(text):
        if m.start(1) in typed:
            continue
        typed.add(m.start(1))
        if m.group(1) not in allowed and not any(shows(v, m.group(1)) for v in pool.pvalues):
            bad.append(f"p '{m.group(1)}' is no p-value of the JSON: ...{where(m)}...")
    for m in SIGNS.finditer(text):
        if m.group(1) not in pool.signs:
            bad.append(f"signs '{m.group(1)}' are no signs of the JSON: ...{where(m)}...")
    for m in NUMBER.finditer(text):
        start = m.start() + (1 if m.group(0)[0] in "+-−" else 0)
        if start in typed or m.start() in typed:
            continue
        number = m.group(0).lstrip("+-−")
        if number in allowed or pool.has(number):
            continue
        bad.append(f"'{m.group(0)}' matches no value of the JSON: ...{where(m)}...")
    return bad


def pool_of(name: str) -> Pool:
    return Pool([json.loads((RESULTS / s).read_text()) for s in SOURCES[name]])


def allowed_in(name: str) -> dict[str, str]:
    return {**ALLOWED["*"], **ALLOWED.get(ALLOWED_GROUP.get(name, ""), {})}


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_every_number_comes_from_the_json(name):
    if not (RESULTS / name).is_file():
        assert name in GENERATED, f"{name}: expected in bench/results"
        pytest.skip(f"{name}: not generated yet")
    bad = unmatched((RESULTS / name).read_text(), pool_of(name), allowed_in(name))
    assert not bad, f"{name}: {len(bad)} number(s) not in {', '.join(SOURCES[name])}:\n" + "\n".join(bad)


PLANTED = [  # (file, a passage as it stands, the same passage with numbers gone wrong, how many are wrong)
    ("table1_findings.md", "(adjusted p 0.051)", "(adjusted p 0.047)", 1),  # the issue's: table1.json says 0.0512
    ("table1_findings.md", "(adjusted p 0.31-0.72)", "(adjusted p 0.28-0.60)", 2),  # the issue's: 0.31-0.72
    ("table1_findings.md", "+2.0 ± 0.9 and balanced-adj +2.8 ± 1.1", "+2.0 ± 0.9 and balanced-adj +2.8 ± 1.3", 1),
    ("table2_findings.md", "+2.9 ± 1.8 (+++++)", "+2.9 ± 1.6 (+++++)", 1),
    ("table2_findings.md", "(----+)", "(---++)", 2),  # both the pair it follows and the signs alone
    ("budget_curve_findings.md", "(+++) p 0.006", "(+++) p 0.016", 1),
    ("table2_findings.md", "from 660 to 1,418", "from 660 to 1,300", 1),  # the drift this test found
]


@pytest.mark.parametrize("name,right,wrong,count", PLANTED)
def test_a_planted_wrong_number_fails(name, right, wrong, count):
    text = (RESULTS / name).read_text()
    assert right in text, f"{name}: the passage {right!r} to plant in is gone; pick another"
    pool, allowed = pool_of(name), allowed_in(name)
    assert not unmatched(text, pool, allowed)
    got = unmatched(text.replace(right, wrong, 1), pool, allowed)
    assert len(got) == count, got


# The passages of README.md and docs/ that report the paper tables' results: (file, from, to) -> sources.
DOC_SECTIONS: dict[tuple[str, str, str], tuple[str, ...]] = {
    ("docs/training.md", "## Weighting strategies", "## The run directory"): (
        "table1.json", "table1_dev.json", "table1_rerun.json", "budget_curve.json", "factorial.json"),
    ("README.md", "**When inference-aware weighting pays**", "**Test it**"): (
        "table1.json", "budget_curve.json", "factorial.json"),
}  # fmt: skip


@pytest.mark.parametrize("where", sorted(DOC_SECTIONS), ids=lambda w: f"{w[0]}:{w[1].strip('#* ')}")
def test_every_number_in_the_docs_results_comes_from_the_json(where):
    path, start, end = where
    text = (RESULTS.parent.parent / path).read_text()
    assert start in text and end in text, f"{path}: the passage {start!r} .. {end!r} is gone; update DOC_SECTIONS"
    passage = text[text.index(start) : text.index(end)]
    pool = Pool([json.loads((RESULTS / s).read_text()) for s in DOC_SECTIONS[where]])
    bad = unmatched(passage, pool, ALLOWED["*"])
    sources = ", ".join(DOC_SECTIONS[where])
    assert not bad, f"{path} ({start}): {len(bad)} number(s) not in {sources}:\n" + "\n".join(bad)


# README.md and docs/: their measured figures stand between markers (bench/doc_marks.py), written by the
# benchmark's report from its JSON; each must be what the committed JSON gives now.
def marked_figures() -> dict[str, dict[str, str]]:
    import bench.head_update as head_update
    import bench.peers.report as peers
    import bench.weighting as weighting

    return {
        "peers": peers.figures(json.loads((RESULTS / "peers.json").read_text())),
        "weighting": weighting.figures(),
        "head_update": head_update.figures(json.loads((RESULTS / "head_update.json").read_text())),
    }


@pytest.mark.parametrize("kind", ["peers", "weighting", "head_update"])
def test_every_marked_figure_in_the_docs_is_the_jsons(kind):
    from bench import doc_marks

    want = marked_figures()[kind]
    shown = doc_marks.marked(kind)
    assert shown, f"no <!--{kind} NAME--> marker in README.md or docs/"
    bad = [f"{p.name}: {k}: shows {v!r}, the JSON gives {want.get(k, '(no such figure)')!r}"
           for p, k, v in shown if want.get(k) != v]  # fmt: skip
    assert not bad, "\n".join(bad) + f"\n(rewrite them: python -m bench.{kind} / the benchmark's --report)"


def test_a_planted_wrong_marked_figure_fails(tmp_path):
    from bench import doc_marks

    want = marked_figures()["weighting"]
    doc = tmp_path / "doc.md"
    doc.write_text(f"a <!--weighting back_flops-->{want['back_flops']}<!--/weighting--> b "
                   "<!--weighting front_flops-->-9.9 ± 9.9 (-----)<!--/weighting-->")  # fmt: skip
    bad = [k for _, k, v in doc_marks.marked("weighting", (doc,)) if want[k] != v]
    assert bad == ["front_flops"]
    assert doc_marks.fill("weighting", want, (doc,)) == 2 and not [
        k for _, k, v in doc_marks.marked("weighting", (doc,)) if want[k] != v
    ]
    doc.write_text("<!--weighting no_such_figure-->1<!--/weighting-->")
    with pytest.raises(SystemExit, match="no_such_figure"):
        doc_marks.fill("weighting", want, (doc,))


@pytest.mark.parametrize("findings", sorted(RESULTS.glob("*_findings.md")), ids=lambda p: p.name)
def test_each_report_carries_its_findings_file_as_it_is_now(findings):
    """A report (NAME.md, and NAME.json's ``findings`` where it keeps one) embeds NAME_findings.md when the report
    is written; a findings file corrected later must be written into its report again (``python -m bench.NAME
    --report``), or the report keeps the old words (table1.md and budget_curve.md did, after issue 44's
    corrections)."""
    text = findings.read_text().strip()
    stem = findings.name.removesuffix("_findings.md")
    assert text in (RESULTS / f"{stem}.md").read_text(), f"{stem}.md: rerun python -m bench.{stem} --report"
    data = json.loads((RESULTS / f"{stem}.json").read_text())
    if "findings" in data:
        assert data["findings"].strip() == text, f"{stem}.json: rerun python -m bench.{stem} --report"
