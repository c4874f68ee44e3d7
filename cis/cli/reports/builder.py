"""One report writer for ``cis report`` and ``cis demo``: a folder in, sections, markdown and plots out.

    report = build_report("runs/d1")          # a run dir, a bundle, a sim dir, a runtime dir or a demo dir
    write_report(report, "report.md")         # report.md + plots/*.png beside it
    print(text_summary(report))               # cis.cli.reports.render

The pieces: :mod:`cis.cli.reports.readers` (one section per folder kind), :mod:`cis.cli.reports.compare` (the
comparison maths of a demo's views), :mod:`cis.cli.reports.render` (text and markdown), :mod:`cis.cli.reports.plots`.
No torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cis.cli.reports.compare import agreement
from cis.cli.reports.plots import write_plots
from cis.cli.reports.readers import SECTIONS, detect_kind, read_json, reads, sim_section
from cis.cli.reports.render import markdown
from cis.core.errors import CisError


def build_report(path: str | Path) -> dict:
    """The report of whatever ``path`` holds (see :func:`cis.cli.reports.readers.detect_kind`)."""
    path = Path(path)
    if not path.is_dir():
        raise CisError(f"{path}: not a folder; expected a run dir, a bundle, a simulation folder or a demo folder")
    kind = detect_kind(path)
    report: dict[str, Any] = {"kind": kind, "path": str(path)}
    if kind != "demo":
        report[kind] = SECTIONS[kind](path)
        return report
    comparison = read_json(path / "comparison.json")
    for name, section in SECTIONS.items():
        if (path / name).is_dir():
            report[name] = section(path / name)
    if (path / "sim-bundle" / "result.json").is_file():
        report["sim_bundle_profile"] = sim_section(path / "sim-bundle")
    comparison["latency"] = {view: report.get(view, {}).get("latency") for view in ("runtime", "sim")}
    comparison["agreement"] = agreement(comparison)
    report["comparison"] = comparison
    report["settings"] = comparison.get("settings")
    report["timings_s"] = comparison.get("timings_s")
    return report


def write_report(report: dict, md_path: str | Path) -> list[str]:
    """Write the markdown to ``md_path`` and its plots to ``plots/`` beside it; returns notes."""
    md_path = Path(md_path)
    if reads(Path(report["path"]), report["kind"], md_path):
        raise CisError(f"--out {md_path}: a file the report of {report['path']} reads; expected a new file (e.g. "
                       f"{Path(report['path']) / 'report.md'})")
    md_path.parent.mkdir(parents=True, exist_ok=True)
    made, notes = write_plots(report, md_path.parent / "plots")
    rel = {k: str(p.relative_to(md_path.parent)) for k, p in made.items()}
    report["plots"] = {k: str(p) for k, p in made.items()}
    text = markdown(report, rel) + "".join(f"\n_note: {n}_\n" for n in notes)
    md_path.write_text(text)
    return notes
