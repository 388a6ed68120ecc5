"""Grade reports: a terminal table, and a directory with Markdown, HTML (plots embedded), JUnit XML
(one test case per verdict) and PNG plots; the Markdown also goes to GitHub's step summary.

The HTML page a person reads puts a summary first (lab x world size, a mark per cell, the failing
checks named), then the failures, then the plots, with the full table folded below.

Scaling studies (`distlab scale`) get the same pair, report.md and report.html in the study's
folder: the outcome and the table of world sizes first, then the plots, then where the numbers
came from; the Markdown goes to the step summary too.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import json
import os
import re
import socket
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from markdown_it import MarkdownIt
from rich.markup import escape
from rich.table import Table

from harness.catalog import REPO
from harness.console import printable
from harness.files import read_json, write_json
from harness.report.plots import grade_plots
from harness.verdict.verdicts import Sample, Verdict

MARK = {True: "pass", False: "FAIL", None: "n/a"}


def verdict_table(verdicts: list[Verdict], title: str) -> Table:
    table = Table(title=escape(title))
    # A speed row shows what other work did meanwhile beside its result (speed.speed_rule).
    interference = any(v.interference for v in verdicts)
    for column in ("lab", "ws", "check", "measured", "expected", "result", *(["interference"] if interference else [])):
        table.add_column(column)
    style = {True: "green", False: "bold red", None: "dim"}
    for v in verdicts:
        table.add_row(escape(v.lab), "all" if v.world_size is None else str(v.world_size), escape(v.check),
                      escape(v.measured), escape(v.expected), f"[{style[v.passed]}]{MARK[v.passed]}[/]",
                      *([escape(v.interference)] if interference else []))
    return table


def cell_matrix(verdicts: list[Verdict]) -> tuple[list[str], list[str], dict[tuple[str, str], list[Verdict]]]:
    """Verdicts by (lab, world size): the rows, the columns ("all": checks across world sizes) and cells."""
    cells: dict[tuple[str, str], list[Verdict]] = {}
    for v in verdicts:
        cells.setdefault((v.lab, "all" if v.world_size is None else str(v.world_size)), []).append(v)
    labs = list(dict.fromkeys(v.lab for v in verdicts))
    sizes = sorted({ws for _, ws in cells if ws != "all"}, key=int) + (["all"] if any(
        ws == "all" for _, ws in cells) else [])
    return labs, sizes, cells


def _cell_mark(cell: list[Verdict]) -> tuple[str, list[str]]:
    failed = [v.check for v in cell if v.passed is False]
    if failed:
        return "FAIL", failed
    return ("pass" if any(v.passed for v in cell) else "n/a"), []


def markdown(summary: dict[str, Any], verdicts: list[Verdict], images: list[Path]) -> str:
    failed = sum(v.passed is False for v in verdicts)
    lines = [f"# distlab grade: {'FAILED' if failed else 'passed'}", "",
             f"Profile **{summary['profile']}**{' (provisional)' if summary['provisional'] else ''}; "
             f"{summary['runs']} run(s) in {summary['wall_seconds']:.0f} s; "
             f"{sum(v.passed is True for v in verdicts)} passed, {failed} failed, "
             f"{sum(v.passed is None for v in verdicts)} n/a.", ""]
    labs, sizes, cells = cell_matrix(verdicts)
    lines += ["| lab | " + " | ".join(f"ws {ws}" if ws != "all" else "across" for ws in sizes) + " |",
              "|---" * (len(sizes) + 1) + "|"]
    for lab in labs:
        marks = []
        for ws in sizes:
            if (lab, ws) not in cells:
                marks.append("")
                continue
            mark, failing = _cell_mark(cells[lab, ws])
            marks.append(f"**FAIL**: {', '.join(failing)}" if failing else mark)
        lines.append(f"| {lab} | " + " | ".join(m.replace("|", "\\|") for m in marks) + " |")
    lines += ["", "| lab | ws | check | measured | expected | result | detail |", "|---|---|---|---|---|---|---|"]
    for v in sorted(verdicts, key=lambda v: v.passed is not False):  # failures first
        row = [v.lab, "all" if v.world_size is None else str(v.world_size), v.check, v.measured, v.expected,
               MARK[v.passed] if v.passed is not False else "**FAIL**", v.detail]
        lines.append("| " + " | ".join(md_cell(c) for c in row) + " |")
    lines += [""] + [f"![{p.stem}]({p.name})" for p in images]
    return "\n".join(lines) + "\n"


def md_cell(text: str) -> str:
    """Text safe inside one Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


_PLAIN = re.compile(r"[\w:.\-/ ]*")  # a check's name, a lab's: nothing Markdown reads as markup


def md_code(text: str) -> str:
    """Text a program could have written, shown in Markdown as it is: an inline code span on one line
    (in it no link, no HTML, no emphasis, no heading), its fence longer than any run of backticks in it."""
    text = printable(" ".join(str(text).split()))
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence, pad = "`" * (longest + 1), " " if text[:1] == "`" or text[-1:] == "`" else ""
    return f"{fence}{pad}{text}{pad}{fence}" if text else ""


def md_name(text: str) -> str:
    """A name (a check, a student) as plain text where it is plain, else as code (md_code)."""
    return text if _PLAIN.fullmatch(text) else md_code(text)


# CommonMark with raw HTML off: markdown-it-py, which rich (a dependency) is built on. Course text only.
_MARKDOWN = MarkdownIt("commonmark", {"html": False})


def md_html(text: str) -> str:
    """The course's own Markdown (a lesson's meaning and fix, a line of ours with `code` in it) as
    inline HTML: code spans, emphasis and links rendered, any HTML in it escaped. Never for text a
    program wrote: that is escaped and shown as it is (html.escape, feedback.html_text)."""
    return _MARKDOWN.renderInline(printable(str(text)))


def _rows(verdicts: list[Verdict]) -> str:
    e = html.escape
    return "\n".join(
        f"<tr class='{MARK[v.passed].lower().replace('/', '')}'><td>{e(v.lab)}</td>"
        f"<td>{'all' if v.world_size is None else v.world_size}</td><td>{e(v.check)}</td>"
        f"<td>{e(v.measured)}</td><td>{e(v.expected)}</td><td>{MARK[v.passed]}</td>"
        f"<td>{e(v.detail)}</td></tr>" for v in verdicts)


def html_page(summary: dict[str, Any], verdicts: list[Verdict], images: list[Path]) -> str:
    e = html.escape  # everything that came from a record, a profile or a lab's output
    failed = [v for v in verdicts if v.passed is False]
    labs, sizes, cells = cell_matrix(verdicts)
    head = "".join(f"<th>{'across sizes' if ws == 'all' else f'ws {ws}'}</th>" for ws in sizes)
    matrix = []
    for lab in labs:
        tds = []
        for ws in sizes:
            if (lab, ws) not in cells:
                tds.append("<td></td>")
                continue
            mark, failing = _cell_mark(cells[lab, ws])
            tds.append(f"<td class='{mark.lower().replace('/', '')}'>{mark}"
                       + (f"<br><small>{e(', '.join(failing))}</small>" if failing else "") + "</td>")
        matrix.append(f"<tr><th>{e(lab)}</th>{''.join(tds)}</tr>")
    header = "<tr>" + "".join(f"<th>{c}</th>" for c in ("lab", "ws", "check", "measured", "expected", "result",
                                                         "detail")) + "</tr>"
    failures = (f"<h2>Failures ({len(failed)})</h2><table>{header}{_rows(failed)}</table>" if failed
                else "<h2>No failures</h2>")
    profile = e(summary["profile"])
    return page(f"distlab grade: {profile}", f"""<h1>distlab grade: {'FAILED' if failed else 'passed'}</h1>
<p>Profile <b>{profile}</b>{' (provisional)' if summary['provisional'] else ''};
{summary['runs']} run(s) in {summary['wall_seconds']:.0f} s; {len(failed)} failed check(s).</p>
<table><tr><th>lab</th>{head}</tr>
{chr(10).join(matrix)}
</table>
{failures}
<h2>Plots</h2>
{figures(images)}
<details><summary>All {len(verdicts)} checks</summary>
<table>{header}
{_rows(verdicts)}
</table></details>
""")


def figures(images: list[Path]) -> str:
    """Plots inline as data URIs: the page is one file that can be mailed or attached as is."""
    e = html.escape
    return "\n".join(
        f"<figure><img alt='{e(p.stem)}' src='data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}'>"
        f"<figcaption>{e(p.stem)}</figcaption></figure>" for p in images)


def page(title: str, body: str) -> str:
    """One HTML page, one style, for every report: `title` already escaped, `body` already HTML. A cell of
    class "said" holds what a program wrote (an error with a 70-character path in it): it may break
    anywhere, so that its table fits a 1280 px page; the course's own words break between words only."""
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse;margin-bottom:1em;max-width:100%}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top;overflow-wrap:break-word}}
.said{{overflow-wrap:anywhere;min-width:16em}}
.fail{{background:#fdd}} .pass{{background:#dfd}} .na{{color:#888}} img{{max-width:100%}}
code{{background:#f3f3f3;padding:0 2px;overflow-wrap:anywhere}} summary{{cursor:pointer;font-size:1.2em}}</style>
</head><body>
{body}</body></html>
"""


# JUnit XML, read by CI: valid against both definitions CI systems read it by, Jenkins' xUnit schema
# and Apache Ant's (tests/fixtures/junit/ vendors both; tests/test_junit.py validates). Ant's is the
# strict one: every suite has properties, system-out and system-err, a timestamp, a hostname and a
# time, and no attribute beyond its list; so the program and the run directories, which neither
# schema lets a test case carry, are each suite's properties (`file`, `log`) and its system-out.
XML_INVALID = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
RUN_JSON_BYTES = 1 << 20


def _xml_text(text: str) -> str:
    """Text XML 1.0 can hold: a lab's output in a detail may carry control characters."""
    return XML_INVALID.sub("\ufffd", text)


def _run_account(run_dir: str) -> dict[str, Any]:
    """The harness's own run.json of a run (read with a limit: it lies in a folder the program could write)."""
    try:
        account = read_json(Path(run_dir) / "run.json", RUN_JSON_BYTES)
    except (OSError, ValueError):
        return {}
    return account if isinstance(account, dict) else {}


def _junit_kind(v: Verdict) -> str | None:
    """"error" for what could not be judged (a run that crashed, hung or was stopped, a metric that
    could not be measured, an interrupted grade), "failure" for a check that was judged and failed."""
    if v.passed is not False:
        return None
    return "error" if v.check in ("run", "completed") or v.measured in ("missing", "-") else "failure"


def _suite_key(v: Verdict) -> tuple[str, str]:
    return v.lab, "across" if v.world_size is None else f"ws{v.world_size}"


def junit(verdicts: list[Verdict], out: Path, done: dict[tuple[str, int], list[Sample]] | None = None,
          started: float | None = None) -> None:
    """One test suite per lab and world size, one test case per verdict; the suite's time is its runs'
    wall time, which the `run` case carries (the other checks are computed from those runs, in no time
    of their own); the suite names the program (`file`) and the run directories with their logs,
    relative to the report's folder, where an artifact of the results folder keeps them."""
    done = done or {}
    stamp = dt.datetime.fromtimestamp(started if started is not None else time.time(), dt.timezone.utc)
    suites: dict[tuple[str, str], list[Verdict]] = {}
    for v in verdicts:
        suites.setdefault(_suite_key(v), []).append(v)
    testsuites = ET.Element("testsuites")
    for number, ((lab, cell), cases) in enumerate(suites.items()):
        samples = [s for (row, ws), runs in done.items() if row == lab and (cell == "across" or cell == f"ws{ws}")
                   for s in runs]
        seconds = sum(s.wall_seconds for s in samples)
        kinds = [_junit_kind(v) for v in cases]
        suite = ET.SubElement(testsuites, "testsuite", name=f"{lab}.{cell}", package="distlab", id=str(number),
                              timestamp=stamp.strftime("%Y-%m-%dT%H:%M:%S"), hostname=socket.gethostname() or
                              "localhost", tests=str(len(cases)), failures=str(kinds.count("failure")),
                              errors=str(kinds.count("error")), skipped=str(sum(v.passed is None for v in cases)),
                              time=f"{seconds:.3f}")
        accounts = [(s, _run_account(s.run_dir)) for s in samples]
        programs = sorted({str(_shown_path(Path(a["program"]))) for _, a in accounts if a.get("program")})
        logs = [os.path.relpath(s.run_dir, out.parent) for s in samples]
        properties = ET.SubElement(suite, "properties")
        for name, value in [*(("file", p) for p in programs), *(("log", log) for log in logs)]:
            ET.SubElement(properties, "property", name=name, value=_xml_text(value))
        for v, kind in zip(cases, kinds, strict=True):
            case = ET.SubElement(suite, "testcase", name=v.check, classname=f"distlab.{lab}.{cell}",
                                 time=f"{seconds if v.check == 'run' else 0:.3f}")
            message = _xml_text(f"{v.check}: measured {v.measured}, expected {v.expected}")
            if kind == "error":
                ET.SubElement(case, "error", type="not judged" if v.check != "run" else "run failed",
                              message=message).text = _xml_text(v.detail) + _logs_line(logs)
            elif kind == "failure":
                ET.SubElement(case, "failure", type="check failed", message=message).text = _xml_text(v.detail)
            elif v.passed is None:
                ET.SubElement(case, "skipped", message=_xml_text(v.detail or "not applicable"))
        lines = []
        for (sample, account), log in zip(accounts, logs, strict=True):
            ranks = account.get("rank_logs") or {}
            files = ", ".join(os.path.join(log, str(name)) for name in ranks.values()) if isinstance(ranks, dict) \
                else ""
            lines.append(f"run {log}: {sample.status} in {sample.wall_seconds:.1f} s"
                         f"{f' ({sample.reason})' if sample.reason else ''}; logs: "
                         f"{files or log}, {os.path.join(log, 'launcher.log')}")
        ET.SubElement(suite, "system-out").text = _xml_text("\n".join(lines))
        ET.SubElement(suite, "system-err").text = ""
    ET.indent(testsuites)
    ET.ElementTree(testsuites).write(out, encoding="utf-8", xml_declaration=True)


def _shown_path(path: Path) -> Path:
    """A program as a CI reporter finds it: relative to the repository when it lies there."""
    return path.relative_to(REPO) if path.is_relative_to(REPO) else path


def _logs_line(logs: list[str]) -> str:
    return f"\nlogs: {', '.join(logs)}" if logs else ""


def write_report(report_dir: Path, summary: dict[str, Any], verdicts: list[Verdict],
                 done: dict[tuple[str, int], list[Sample]], single_device: dict[str, str] | None = None
                 ) -> dict[str, Path]:
    report_dir.mkdir(parents=True, exist_ok=True)
    images = grade_plots(done, report_dir, single_device)
    write_json(report_dir / "verdicts.json", [v.to_dict() for v in verdicts])
    write_json(report_dir / "summary.json", {
        **summary, "runs_by_cell": {f"{lab}@{ws}": [s.run_dir for s in samples]
                                    for (lab, ws), samples in done.items()}})
    paths = {"markdown": report_dir / "report.md", "html": report_dir / "report.html",
             "junit": report_dir / "junit.xml"}
    paths["markdown"].write_text(markdown(summary, verdicts, images))
    paths["html"].write_text(html_page(summary, verdicts, images))
    junit(verdicts, paths["junit"], done, time.time() - summary["wall_seconds"] if "wall_seconds" in summary else None)
    return paths


def append_step_summary(markdown_path: Path) -> None:
    """On GitHub Actions, the report also becomes the job's summary page."""
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with Path(summary).open("a") as handle:
            handle.write(markdown_path.read_text())


# --------------------------------------------------------------------------------- scaling studies

# The table of world sizes: (column, what the cell shows), one definition for Markdown and HTML.
SCALE_COLUMNS = ("world size", "batch/rank", "global batch", "img/s", "95% CI", "img/s per rank", "speedup",
                 "efficiency", "step ms", "compute ms", "comm ms", "all-reduce alone ms", "comm share", "overlap",
                 "repeats", "note")


def _number(value: float | None, spec: str, scale: float = 1.0) -> str:
    return "n/a" if value is None else format(value * scale, spec)


def scale_cells(row: dict[str, Any]) -> list[str]:
    """One world size of a scale summary, as text: compute is the step without gradient sync,
    comm the part of the step spent waiting for communication (labs/SCALING.md)."""
    throughput = row["img_per_sec"]
    interval = (f"{throughput['ci95_low']:.1f} to {throughput['ci95_high']:.1f}" if throughput["n"] > 1
                else "n/a (1 run)")
    return [str(row["world_size"]), str(row["per_rank_batch"]), str(row["global_batch"]),
            f"{throughput['mean']:.1f}", interval, f"{row['img_per_sec_per_rank']['mean']:.1f}",
            f"{row['speedup']:.3f}", f"{row['efficiency']:.3f}", _number(row["step_seconds"], ".2f", 1e3),
            _number(row["step_seconds_no_sync"], ".2f", 1e3), _number(row["comm_seconds"], ".2f", 1e3),
            _number(row["allreduce_seconds"], ".2f", 1e3), _number(row["comm_fraction"], ".1%"),
            _number(row["overlap"], ".0%"), str(throughput["n"]),
            "oversubscribed" if row.get("oversubscribed") else ""]


def _scale_headline(summary: dict[str, Any]) -> tuple[str, str]:
    """The title and the one sentence under it: what was run, on what."""
    title = f"distlab scale: {'passed' if summary['status'] == 'ok' else 'FAILED'}"
    sizes = ",".join(map(str, summary["world_sizes"]))
    batch = f", global batch {summary['global_batch']}" if summary["global_batch"] else ""
    sentence = (f"{summary['lab']} ({summary['backend']}, {summary['launcher']}) {summary['mode']} scaling{batch}, "
                f"world sizes {sizes} x {summary['repeats']} repeat(s), {summary['threads_per_rank']} thread(s) "
                f"per rank, {summary['cores']} cores.")
    return title, sentence


def _scale_notes(summary: dict[str, Any]) -> list[str]:
    notes = []
    if summary["amdahl_serial_fraction"] is not None:
        notes.append(f"Amdahl fit (speedup vs world size {summary['baseline_world_size']}): serial fraction "
                     f"{summary['amdahl_serial_fraction']:.3f}.")
    crowded = [str(r["world_size"]) for r in summary["rows"] if r.get("oversubscribed")]
    if crowded:
        notes.append(f"Oversubscribed: world size(s) {', '.join(crowded)} x {summary['threads_per_rank']} "
                     f"thread(s) exceed the {summary['cores']} cores; those numbers show time-slicing, not scaling.")
    load = summary["load_average"]
    notes.append(f"Load average (1 min): {load['before'][0]:.2f} before, {load['after'][0]:.2f} after.")
    return notes


def _scale_provenance(summary: dict[str, Any]) -> list[tuple[str, str]]:
    provenance = summary.get("provenance") or {}
    return [("start", str(summary["start"])), ("end", str(summary["end"])),
            ("lab arguments", " ".join(summary["lab_args"]) or "none"),
            ("levers", json.dumps(summary["levers"], sort_keys=True)),
            *((key, json.dumps(provenance.get(key), sort_keys=True)) for key in ("versions", "hardware", "hostname",
                                                                                  "git_commit"))]


def scale_markdown(summary: dict[str, Any], images: list[Path]) -> str:
    title, sentence = _scale_headline(summary)
    lines = [f"# {title}", "", sentence, ""]
    if summary["status"] != "ok":
        lines += [f"**FAILED**: {summary['reason']}", ""]
    if summary["rows"]:
        lines += ["| " + " | ".join(SCALE_COLUMNS) + " |", "|---" * len(SCALE_COLUMNS) + "|"]
        lines += ["| " + " | ".join(md_cell(c) for c in scale_cells(row)) + " |" for row in summary["rows"]]
        lines.append("")
    lines += [f"- {note}" for note in _scale_notes(summary)] + [""]
    lines += [f"![{p.stem}]({p.name})" for p in images] + ([""] if images else [])
    lines += ["| provenance | |", "|---|---|"] + [f"| {key} | {md_cell(value)} |"
                                                   for key, value in _scale_provenance(summary)]
    return "\n".join(lines) + "\n"


def scale_html(summary: dict[str, Any], images: list[Path]) -> str:
    e = html.escape  # everything that came from a record or the command line
    title, sentence = _scale_headline(summary)
    failed = summary["status"] != "ok"
    table = ""
    if summary["rows"]:
        head = "".join(f"<th>{e(c)}</th>" for c in SCALE_COLUMNS)
        body = "\n".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in scale_cells(row)) + "</tr>"
                         for row in summary["rows"])
        table = f"<table><tr>{head}</tr>\n{body}\n</table>\n"
    notes = "".join(f"<li>{e(note)}</li>" for note in _scale_notes(summary))
    provenance = "\n".join(f"<tr><th>{e(key)}</th><td>{e(value)}</td></tr>"
                           for key, value in _scale_provenance(summary))
    return page(e(f"distlab scale: {summary['lab']} {summary['mode']}"), f"""<h1>{e(title)}</h1>
<p>{e(sentence)}</p>
{f"<p class='fail'><b>FAILED</b>: {e(summary['reason'])}</p>" if failed else ""}
{table}<ul>{notes}</ul>
<h2>Plots</h2>
{figures(images)}
<details><summary>Provenance</summary>
<table>{provenance}</table></details>
""")


def write_scale_report(study_dir: Path, summary: dict[str, Any], images: list[Path]) -> dict[str, Path]:
    """report.md and report.html beside the study's summary.json and plots."""
    paths = {"markdown": study_dir / "report.md", "html": study_dir / "report.html"}
    paths["markdown"].write_text(scale_markdown(summary, images))
    paths["html"].write_text(scale_html(summary, images))
    return paths
