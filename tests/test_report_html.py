"""The HTML report: self-contained, holds the report tables, and its charts draw in a real browser
(headless Chromium) without script errors."""

import re
import shutil
import subprocess

import pyarrow.compute as pc
import pytest

import truth_warehouse
from pipelines import reports, warehouse

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="headless Chromium is not installed (Debian: apt-get install -y chromium)"
)


@pytest.fixture(scope="module")
def tiny(scenario_dir, tmp_path_factory):
    return truth_warehouse.build(scenario_dir("tiny"), tmp_path_factory.mktemp("tiny-truth-warehouse"))


@pytest.fixture(scope="module")
def page(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "report.html"
    reports.build_report(tiny.root, None, None, out, topology=tiny.topology)
    return out


def rendered_dom(page, profile) -> str:
    """The page's DOM after its scripts ran, from headless Chromium (no network, no GPU)."""
    result = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", "--virtual-time-budget=30000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=180,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def charts_drawn(dom: str) -> tuple[int, int, str]:
    """(charts drawn, charts on the page, uncaught script errors) as the page's script left them."""
    drawn = re.search(rf'id="{reports.CHARTS_DRAWN_ID}" data-expected="(\d+)">(\d+)<', dom)
    errors = re.search(rf'id="{reports.SCRIPT_ERRORS_ID}">([^<]*)<', dom)
    assert drawn and errors, "the status elements are missing from the rendered page"
    return int(drawn.group(2)), int(drawn.group(1)), errors.group(1).strip()


def test_report_is_self_contained_and_holds_the_tables(tiny, page):
    text = page.read_text()
    assert not re.search(r"<script[^>]+src=|<link[^>]+href=|<img[^>]+src=", text)  # nothing fetched
    assert "Plotly.newPlot" in text and "window.__prismChartsDrawn" in text
    for heading in ("Fleet utilization", "Waste by issue kind", "Step times", "Job timeline", "Jobs",
                    "Hosts that held up DP synchronization", "GPU time by job size", "Job durations",
                    "Job outcomes, restarts and failures", "Top talkers", "Traffic per hour", "Issues"):
        assert f"<h2>{heading}" in text
    for job_id in tiny.truth["jobs"]["job_id"].to_pylist():
        assert f"<td class=\"text\">{job_id}</td>" in text
    faults = tiny.truth["faults"]
    straggler = faults.filter(pc.equal(faults["kind"], "straggler"))["subject"][0].as_py()
    stragglers = text.split("Hosts that held up DP synchronization")[1]
    assert stragglers.index(f"<td class=\"text\">{straggler}</td>") < stragglers.index("</table>")
    assert "<b>64.0</b><br>GPUs in the inventory" in text  # 8 hosts x 8 GPUs


@needs_chromium
def test_report_charts_draw_in_headless_chromium(page, tmp_path):
    dom = rendered_dom(page, tmp_path / "profile")
    drawn, expected, errors = charts_drawn(dom)
    assert errors == ""
    assert expected == 4 and drawn == expected
    assert dom.count('class="main-svg"') >= 2 * expected  # plotly drew its SVG layers


@needs_chromium
def test_report_of_a_warehouse_without_analysis_still_draws(tiny, tmp_path):
    """Ingest only (the analysis tables are empty placeholders): empty charts, no errors."""
    root = tmp_path / "ingest-only"
    for table in ("flows", "flow_minutes"):
        shutil.copytree(tiny.root / table, root / table)
    warehouse.refresh_database(root)
    out = reports.build_report(root, None, None, tmp_path / "report.html", topology=tiny.topology)
    jobs_table = out.read_text().split("<h2>Jobs</h2>\n<div class=\"table\"><table>")[1].split("</table>")[0]
    assert jobs_table.endswith(">none</td></tr>")
    drawn, expected, errors = charts_drawn(rendered_dom(out, tmp_path / "profile"))
    assert (drawn, expected, errors) == (4, 4, "")
