"""The class grade's pages as a person opens them: headless Chromium renders the class page and one
feedback page of each kind (passed, failed check, crash, ungradable) at 1280 px, and the test reads
back what it laid out: nothing wider than the page, no Markdown left raw (a backtick, `**`).

Built from real outcomes: the verdicts of real grades (tests/fixtures/replay: the course's ddp lab;
replay-wrong: a program that never all-reduces and lies in its record; pages/crash_verdicts.json: one
whose rank 1 raises right after init_process_group), scored by the shipped rubric and written by the
class grade's own writers (outputs.write_student, outputs.class_page).

Opt-in where Chromium is absent: it skips, saying so. `nox -s pages` installs Debian's chromium
(as root) and runs it; DISTLAB_CHROMIUM names another binary.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.classgrade import rubric
from harness.classgrade.account import Outcome
from harness.classgrade.outputs import class_page, write_student
from harness.verdict.verdicts import Verdict

FIXTURES = Path(__file__).resolve().parent / "fixtures"
WIDTH = 1280
LESSONS = "https://course.example/distlab/"  # a course's address for lessons, as grade-class --lessons gives


def chromium() -> str | None:
    return os.environ.get("DISTLAB_CHROMIUM") or next(
        (found for name in ("chromium", "chromium-browser", "google-chrome") if (found := shutil.which(name))), None)


pytestmark = pytest.mark.skipif(chromium() is None, reason="no Chromium here (opt-in: Debian's apt-get install "
                                "chromium, or nox -s pages, which installs it as root)")

# Run in the page after layout: the elements whose right edge passes the viewport's, and the text a
# reader sees (innerText: what is rendered, not the markup). Written into the DOM that --dump-dom prints.
MEASURE = """<script>
(() => {
  const root = document.documentElement;
  const wide = [...document.body.querySelectorAll('*')]
    .filter(el => el.getBoundingClientRect().right > root.clientWidth + 0.5)
    .map(el => `${el.tagName} ${Math.round(el.getBoundingClientRect().right)}px: ${(el.innerText || '').slice(0, 80)}`);
  const found = {viewport: root.clientWidth, scroll: root.scrollWidth, wide: wide.slice(0, 5),
                 text: document.body.innerText};
  const out = document.createElement('pre');
  out.id = 'distlab-measured';
  out.textContent = JSON.stringify(found);
  document.body.appendChild(out);
})();
</script>"""


def verdicts(path: Path, lab: str = "ddp") -> list[Verdict]:
    return [Verdict(**row) for row in json.loads(path.read_text()) if row["lab"] == lab]


def outcomes() -> list[Outcome]:
    """One student of each kind, graded from the stored verdicts as outcome.outcome_of grades them."""
    shipped = rubric.load()
    passed = verdicts(FIXTURES / "replay" / "expected_verdicts.json")
    wrong = verdicts(FIXTURES / "replay-wrong" / "expected_verdicts.json")
    crash = verdicts(FIXTURES / "pages" / "crash_verdicts.json")
    crashed_run = next(v for v in crash if v.check == "run")
    return [
        Outcome("alice", "graded", "", shipped.score(passed), passed, seconds=23.0, rate_ratio=0.88),
        Outcome("bob", "graded", "", shipped.score(wrong), wrong, seconds=21.5, rate_ratio=1.18),
        Outcome("carol", "graded", "", shipped.score(crash), crash, seconds=30.2),
        # A program that never wrote a record of its own: outcome.outcome_of's words, with the crash's reason.
        Outcome("dave", "ungradable", f"it did not run to a record of its own: {crashed_run.detail}"),
    ]


def write_pages(out_dir: Path) -> dict[str, Path]:
    """The class's pages as grade-class writes them: each student's feedback, then the class page."""
    shipped = rubric.load()
    students = outcomes()
    for outcome in students:
        write_student(out_dir, outcome, shipped, LESSONS)
    graded = [o for o in students if o.status == "graded"]
    summary = {"lab": "ddp", "profile": "cpu-smoke", "jobs": 2, "graded": len(graded),
               "ungradable": len(students) - len(graded), "sandbox": "bwrap", "wall_seconds": 754.0,
               "mean": f"{sum(o.score or 0 for o in graded) / len(graded):.2f}"}
    pages = {o.id: out_dir / "feedback" / f"{o.key}.html" for o in students}
    pages["class"] = class_page(out_dir, shipped, students, summary)
    return pages


def rendered(page: Path, browser: str, tmp_path: Path) -> dict:
    """What Chromium laid out for the page at WIDTH px: the page with MEASURE appended, in a copy."""
    measured = tmp_path / f"measured-{page.parent.name}-{page.name}"
    measured.write_text(page.read_text().replace("</body>", MEASURE + "</body>"))
    profile = tmp_path / "chromium-profile"
    # No background networking: on a closed network Chromium's own update and sync calls only fail.
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--disable-background-networking", "--disable-component-update", "--disable-sync",
                           "--no-first-run", f"--user-data-dir={profile}", f"--window-size={WIDTH},2000",
                           "--run-all-compositor-stages-before-draw", "--virtual-time-budget=5000", "--dump-dom",
                           measured.as_uri()], capture_output=True, text=True, timeout=120)
    found = re.search(r"<pre id=\"distlab-measured\">(.*?)</pre>", done.stdout, re.S)
    assert found, f"Chromium printed no measurement (exit {done.returncode}): {done.stderr[-2000:]}"
    return json.loads(html.unescape(found[1]))


def test_every_page_fits_1280_px_and_shows_no_raw_markdown(tmp_path):
    browser = chromium()
    assert browser is not None
    seen = {kind: rendered(page, browser, tmp_path) for kind, page in write_pages(tmp_path / "class").items()}
    for kind, laid_out in seen.items():
        assert laid_out["viewport"] >= WIDTH - 20, laid_out["viewport"]  # the width asked for, less a scroll bar
        assert laid_out["scroll"] <= laid_out["viewport"] and not laid_out["wide"], (kind, laid_out["scroll"],
                                                                                      laid_out["wide"])
        lines = laid_out["text"].splitlines()
        assert not [line for line in lines if "`" in line or "**" in line], kind  # Markdown left raw
        assert not [line for line in lines if "{'" in line], kind  # a Python dict's repr
    # Each page is the kind it is meant to be, as the reader sees it.
    assert "Every check you can see passed." in seen["alice"]["text"]
    assert "observed:replicas_in_step" in seen["bob"]["text"]
    assert "rank 1 gives up" in seen["carol"]["text"]
    assert "Ungradable" in seen["dave"]["text"]
    assert all(student in seen["class"]["text"] for student in ("alice", "bob", "carol", "dave"))
