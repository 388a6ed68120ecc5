"""Grade reports: a terminal table, and a directory with Markdown, HTML (plots embedded),
JUnit XML (written by pytest, one test case per verdict) and PNG plots."""

from __future__ import annotations

import base64
import html
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from harness.grade import Sample, Verdict
from harness.stats import efficiency, mean_ci
from labs.common.contract import write_json_atomic

MARK = {True: "pass", False: "FAIL", None: "n/a"}


def verdict_table(verdicts: list[Verdict], title: str) -> Table:
    table = Table(title=title)
    for column in ("lab", "ws", "check", "measured", "expected", "result"):
        table.add_column(column)
    style = {True: "green", False: "bold red", None: "dim"}
    for v in verdicts:
        table.add_row(v.lab, "all" if v.world_size is None else str(v.world_size), escape(v.check), escape(v.measured),
                      escape(v.expected), f"[{style[v.passed]}]{MARK[v.passed]}[/]")
    return table


def plots(done: dict[tuple[str, int], list[Sample]], out: Path) -> list[Path]:
    """Accuracy per epoch, throughput and efficiency per world size, for the labs that report them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    labs = sorted({lab for lab, _ in done})
    curves = [(lab, ws, s.record["metrics"]["test_accuracy"]) for (lab, ws), samples in sorted(done.items())
              for s in samples[:1] if s.record and isinstance(s.record.get("metrics", {}).get("test_accuracy"), list)]
    if curves:
        fig, ax = plt.subplots(figsize=(6, 4))
        for lab, ws, accuracy in curves:
            ax.plot(range(1, len(accuracy) + 1), accuracy, marker="o", label=f"{lab} ws={ws}")
        ax.set(xlabel="epoch", ylabel="test accuracy", title="Accuracy per epoch")
        ax.legend(fontsize="small")
        written.append(_save(fig, out / "accuracy.png"))
    throughput: dict[str, dict[int, Any]] = {}
    for (lab, ws), samples in done.items():
        values = [s.record["metrics"]["img_per_sec"] for s in samples if s.status == "ok" and s.record
                  and isinstance(s.record["metrics"].get("img_per_sec"), (int, float))]
        if values:
            throughput.setdefault(lab, {})[ws] = mean_ci([float(v) for v in values])
    if throughput:
        fig, (ax_t, ax_e) = plt.subplots(1, 2, figsize=(10, 4))
        for lab in labs:
            if lab not in throughput:
                continue
            sizes = sorted(throughput[lab])
            means = [throughput[lab][ws].mean for ws in sizes]
            errors = [throughput[lab][ws].half_width for ws in sizes]
            ax_t.errorbar(sizes, means, yerr=errors, marker="o", capsize=3, label=lab)
            if 1 in throughput[lab]:
                base = throughput[lab][1].mean
                ax_e.plot(sizes, [efficiency(m, ws, base) for m, ws in zip(means, sizes, strict=True)],
                          marker="o", label=lab)
        ax_t.set(xlabel="world size", ylabel="images/s (total)", title="Throughput (95% CI)")
        ax_e.axhline(1.0, color="grey", linestyle="--", label="ideal")
        ax_e.set(xlabel="world size", ylabel="efficiency T(n)/(n T(1))", title="Scaling efficiency", ylim=(0, 1.2))
        for ax in (ax_t, ax_e):
            ax.legend(fontsize="small")
        written.append(_save(fig, out / "throughput.png"))
    return written


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def markdown(summary: dict[str, Any], verdicts: list[Verdict], images: list[Path]) -> str:
    failed = sum(v.passed is False for v in verdicts)
    lines = [f"# distlab grade: {'FAILED' if failed else 'passed'}", "",
             f"Profile **{summary['profile']}**{' (provisional)' if summary['provisional'] else ''}; "
             f"{summary['runs']} run(s) in {summary['wall_seconds']:.0f} s; "
             f"{sum(v.passed is True for v in verdicts)} passed, {failed} failed, "
             f"{sum(v.passed is None for v in verdicts)} n/a.", "",
             "| lab | ws | check | measured | expected | result | detail |", "|---|---|---|---|---|---|---|"]
    for v in verdicts:
        cells = [v.lab, "all" if v.world_size is None else str(v.world_size), v.check, v.measured, v.expected,
                 MARK[v.passed] if v.passed is not False else "**FAIL**", v.detail]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    lines += [""] + [f"![{p.stem}]({p.name})" for p in images]
    return "\n".join(lines) + "\n"


def html_page(summary: dict[str, Any], verdicts: list[Verdict], images: list[Path]) -> str:
    failed = sum(v.passed is False for v in verdicts)
    rows = "\n".join(
        f"<tr class='{MARK[v.passed].lower().replace('/', '')}'><td>{html.escape(v.lab)}</td>"
        f"<td>{'all' if v.world_size is None else v.world_size}</td><td>{html.escape(v.check)}</td>"
        f"<td>{html.escape(v.measured)}</td><td>{html.escape(v.expected)}</td><td>{MARK[v.passed]}</td>"
        f"<td>{html.escape(v.detail)}</td></tr>" for v in verdicts)
    # Plots inline as data URIs: the page is one file that can be mailed or attached as is.
    figures = "\n".join(
        f"<figure><img alt='{p.stem}' src='data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}'>"
        f"<figcaption>{p.stem}</figcaption></figure>" for p in images)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>distlab grade: {summary['profile']}</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px}} tr.fail{{background:#fdd}} tr.na{{color:#888}}
img{{max-width:100%}}</style></head><body>
<h1>distlab grade: {'FAILED' if failed else 'passed'}</h1>
<p>Profile <b>{html.escape(summary['profile'])}</b>{' (provisional)' if summary['provisional'] else ''};
{summary['runs']} run(s) in {summary['wall_seconds']:.0f} s; {failed} failed check(s).</p>
<table><tr><th>lab</th><th>ws</th><th>check</th><th>measured</th><th>expected</th><th>result</th><th>detail</th></tr>
{rows}
</table>
{figures}
</body></html>
"""


def junit(verdicts_json: Path, out: Path) -> None:
    """pytest writes the JUnit XML: one test case per verdict, failures with their detail."""
    cases = Path(__file__).with_name("junit_cases.py")
    env = dict(os.environ, DISTLAB_VERDICTS=str(verdicts_json))
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                    "-c", os.devnull, "--rootdir", str(out.parent), "-o", "junit_family=xunit2",
                    "-o", "junit_suite_name=distlab-grade", f"--junitxml={out}", str(cases)],
                   env=env, capture_output=True, text=True, check=False)
    if not out.exists():
        raise RuntimeError(f"pytest did not write {out}")


def write_report(report_dir: Path, summary: dict[str, Any], verdicts: list[Verdict],
                 done: dict[tuple[str, int], list[Sample]]) -> dict[str, Path]:
    report_dir.mkdir(parents=True, exist_ok=True)
    images = plots(done, report_dir)
    verdicts_json = report_dir / "verdicts.json"
    write_json_atomic(verdicts_json, [v.to_dict() for v in verdicts])
    write_json_atomic(report_dir / "summary.json", {
        **summary, "runs_by_cell": {f"{lab}@{ws}": [s.run_dir for s in samples]
                                    for (lab, ws), samples in done.items()}})
    paths = {"markdown": report_dir / "report.md", "html": report_dir / "report.html",
             "junit": report_dir / "junit.xml"}
    paths["markdown"].write_text(markdown(summary, verdicts, images))
    paths["html"].write_text(html_page(summary, verdicts, images))
    junit(verdicts_json, paths["junit"])
    return paths


def load_verdicts(path: Path) -> list[Verdict]:
    return [Verdict(**row) for row in json.loads(path.read_text())]
