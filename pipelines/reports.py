"""Analyst reports over a warehouse: the queries of sql/reports/ run against its prism.duckdb, and
the HTML report that puts their tables and charts in one self-contained file.

Every report is a plain .sql file that any DuckDB client can run after sql/reports/base.sql (see
docs/analysts.md); this module only opens the database, supplies the inventory when the warehouse
has none, sets the report's variables and collects Arrow tables.
"""

from __future__ import annotations

import html
import json
from datetime import datetime, timezone
from pathlib import Path

import duckdb
import plotly.graph_objects as go
import plotly.offline
import pyarrow as pa
import pyarrow.compute as pc

from pipelines import storage, warehouse
from prism_core.topology import Topology, TopologyError

REPORTS_DIR = warehouse.SQL_DIR / "reports"
BASE = "base"  # temp views every report builds on
CHARTS_DRAWN_ID = "prism-charts-drawn"  # filled by the page's script: how many charts plotly drew
SCRIPT_ERRORS_ID = "prism-script-errors"  # filled by the page's script: uncaught errors
STEP_CHART_JOBS = 40  # jobs selectable in the step-time chart, most wasteful first
STRAGGLER_ROWS = 25


class ReportError(RuntimeError):
    """A report cannot be made; the message is meant for the operator."""


def report_names() -> list[str]:
    """The reports in sql/reports/, by file name without .sql."""
    return sorted(p.stem for p in REPORTS_DIR.glob("*.sql") if p.stem != BASE)


def connect(
    root: str | Path,
    start: datetime | None = None,
    end: datetime | None = None,
    topology: str | Path | None = None,
) -> duckdb.DuckDBPyConnection:
    """A read-only connection to the warehouse's prism.duckdb, ready for `run_report`.

    The inventory is the warehouse's `topology` table when it has one, else the CSV at `topology`,
    else every address seen in flow_minutes as its own one-GPU host (the contract's rule without
    an inventory). `start` / `end` bound the report range (UTC; default: every hour with flows).
    """
    database = storage.join(root, warehouse.DATABASE_FILE)
    if not storage.exists(database):
        raise ReportError(f"{database} does not exist: run the pipeline on {root} first")
    if not warehouse.partition_files(root, "flow_minutes"):
        raise ReportError(f"the warehouse at {root} has no flow_minutes: nothing to report")
    con = warehouse.connect(root)
    con.execute("SET TimeZone = 'UTC'")  # instants in results print and convert as UTC
    con.execute("SET enable_progress_bar = false")  # reports run under the CLI's own progress
    if topology is not None:
        try:
            inventory = Topology.from_csv_bytes(storage.read_bytes(topology), str(topology)).inventory
        except (OSError, TopologyError) as error:
            con.close()
            raise ReportError(f"inventory {topology}: {error}") from None
        con.register("topology", inventory)
    elif not _has_relation(con, "topology"):
        con.execute(
            "CREATE TEMP VIEW topology AS "
            "SELECT DISTINCT addr, addr AS host, 0 AS gpu, NULL AS leaf, NULL AS pod "
            "FROM (SELECT src_addr AS addr FROM flow_minutes UNION SELECT dst_addr FROM flow_minutes)"
        )
    for name, instant in (("report_start", start), ("report_end", end)):
        if instant is not None:
            con.execute(f"SET VARIABLE {name} = ?", [_utc(instant)])
    con.execute(_sql(BASE))
    return con


def run_report(con: duckdb.DuckDBPyConnection, name: str, **variables) -> pa.Table:
    """Run sql/reports/<name>.sql on a `connect`ed connection with the given variables set (and
    reset afterwards, so they do not leak into the next report)."""
    if name not in report_names():
        raise ReportError(f"no report {name!r}; reports: {', '.join(report_names())}")
    for key, value in variables.items():
        con.execute(f"SET VARIABLE {key} = ?", [value])
    try:
        return con.sql(_sql(name)).to_arrow_table()
    finally:
        for key in variables:
            con.execute(f"RESET VARIABLE {key}")


def _sql(name: str) -> str:
    return (REPORTS_DIR / f"{name}.sql").read_text()


def _has_relation(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    found = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE table_name = $1 "
        "UNION ALL SELECT count(*) FROM duckdb_views() WHERE view_name = $1",
        [name],
    ).fetchall()
    return sum(count for (count,) in found) > 0


def _utc(instant: datetime) -> datetime:
    return instant.astimezone(timezone.utc) if instant.tzinfo else instant.replace(tzinfo=timezone.utc)


# --- the HTML report ----------------------------------------------------------------------------


def build_report(
    root: str | Path,
    start: datetime | None,
    end: datetime | None,
    out: str | Path,
    topology: str | Path | None = None,
) -> Path:
    """Write the fleet and job report of the warehouse at `root` for [start, end) to `out`: one
    self-contained HTML file (plotly inlined, nothing fetched from the network)."""
    with connect(root, start, end, topology) as con:
        (range_start, range_end), = con.execute(
            "SELECT timezone('UTC', range_start), timezone('UTC', range_end) FROM report_range"
        ).fetchall()
        tables = {
            name: run_report(con, name)
            for name in (
                "fleet_capacity", "job_summary", "host_stragglers", "fleet_gpu_time_by_size",
                "fleet_job_durations", "fleet_outcomes", "top_talkers", "step_times", "issue_log",
            )
        }
        tables["waste"] = run_report(con, "waste", waste_period="hour")
        tables["traffic_rollup"] = run_report(con, "traffic_rollup", bucket_minutes=60)
    page = render_report(tables, range_start, range_end, title=f"Prism report: {storage.base_name(root)}")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return out


def render_report(tables: dict[str, pa.Table], range_start: datetime, range_end: datetime, title: str) -> str:
    """The report page from the report tables (names as in sql/reports/)."""
    capacity, jobs, waste = tables["fleet_capacity"], tables["job_summary"], tables["waste"]
    charts = [
        ("Fleet utilization", _utilization_chart(capacity)),
        ("Waste by issue kind", _waste_chart(waste)),
        ("Step times", _step_time_chart(tables["step_times"], tables["issue_log"], jobs)),
        ("Job timeline", _gantt_chart(jobs, tables["issue_log"])),
    ]
    sections = [
        _headline(capacity, jobs, tables["issue_log"]),
        *(_chart_section(heading, figure, f"prism-chart-{n}") for n, (heading, figure) in enumerate(charts)),
        _table_section("Jobs", jobs.drop_columns(["ended", "held_until"])),
        _table_section("Waste by job (GPU-hours)", _waste_by_job(waste)),
        _table_section(f"Hosts that held up DP synchronization (top {STRAGGLER_ROWS})",
                       tables["host_stragglers"].slice(0, STRAGGLER_ROWS)),
        _table_section("Capacity by pod over the range", capacity.filter(pc.is_null(capacity["hour"]))),
        _table_section("GPU time by job size", tables["fleet_gpu_time_by_size"]),
        _table_section("Job durations", tables["fleet_job_durations"]),
        _table_section("Job outcomes, restarts and failures", tables["fleet_outcomes"]),
        _table_section("Top talkers", tables["top_talkers"]),
        _table_section("Traffic per hour", tables["traffic_rollup"]),
        _table_section("Issues", tables["issue_log"].drop_columns(["evidence"])),
    ]
    return PAGE.format(
        title=html.escape(title),
        range=f"{range_start:%Y-%m-%d %H:%M} to {range_end:%Y-%m-%d %H:%M} UTC",
        generated=f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
        plotly_js=plotly.offline.get_plotlyjs(),
        charts=len(charts),
        drawn_id=CHARTS_DRAWN_ID,
        errors_id=SCRIPT_ERRORS_ID,
        body="\n".join(sections),
    )


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
div.table {{ max-width: 100%; overflow-x: auto; margin-bottom: 2em; }}
table {{ border-collapse: collapse; font-size: 0.85em; }}
td.text {{ max-width: 32em; overflow-wrap: anywhere; }}
th, td {{ border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: right; }}
th {{ background: #f0f0f0; }} td.text {{ text-align: left; }}
.headline span {{ display: inline-block; margin-right: 2.5em; }} .headline b {{ font-size: 1.4em; }}
.status {{ color: #888; font-size: 0.8em; }}
</style>
<script>
window.__prismChartsDrawn = 0;
window.__prismScriptErrors = [];
function prismShowErrors() {{
  var box = document.getElementById("{errors_id}");
  if (box) box.textContent = window.__prismScriptErrors.join("\\n");
}}
window.addEventListener("error", function (event) {{
  window.__prismScriptErrors.push(event.message); prismShowErrors();
}});
window.addEventListener("unhandledrejection", function (event) {{
  window.__prismScriptErrors.push(String(event.reason)); prismShowErrors();
}});
document.addEventListener("DOMContentLoaded", prismShowErrors);
</script>
<script>{plotly_js}</script>
</head><body>
<h1>{title}</h1>
<p>{range} &middot; generated {generated}</p>
<div class="status">charts drawn: <span id="{drawn_id}" data-expected="{charts}">0</span> of {charts}
<pre id="{errors_id}"></pre></div>
{body}
</body></html>
"""

# Run by plotly once a chart is drawn (plotly.py puts it in the newPlot promise's `then`).
CHART_DRAWN_JS = (
    "window.__prismChartsDrawn += 1;"
    f"document.getElementById('{CHARTS_DRAWN_ID}').textContent = window.__prismChartsDrawn;"
)


def _chart_section(heading: str, figure: go.Figure, div_id: str) -> str:
    # plotly's default top margin leaves an empty band under the heading; keep room only for a
    # title or a menu
    crowned = bool(figure.layout.title.text or figure.layout.updatemenus)
    figure.update_layout(margin={"t": 60 if crowned else 20, "b": 50, "l": 60, "r": 20})
    chart = figure.to_html(
        full_html=False, include_plotlyjs=False, div_id=div_id, post_script=CHART_DRAWN_JS,
        config={"displaylogo": False},
    )
    return f"<h2>{html.escape(heading)}</h2>\n{chart}"


def _headline(capacity: pa.Table, jobs: pa.Table, issues: pa.Table) -> str:
    whole = capacity.filter(pc.and_(pc.is_null(capacity["hour"]), pc.equal(capacity["pod"], "(all)")))
    fleet = whole.to_pylist()[0] if whole.num_rows else {}
    figures = [
        ("GPUs in the inventory", _number(fleet.get("inventory_gpus"))),
        ("busy in recognized jobs", _number(fleet.get("busy_gpus"))),
        ("idle share (no traffic)", _percent(fleet.get("idle_share"))),
        ("jobs", f"{jobs.num_rows}"),
        ("issues", f"{issues.num_rows}"),
        ("GPU-hours wasted", _number(pc.sum(jobs["wasted_gpu_h"]).as_py())),
    ]
    spans = "".join(f"<span><b>{value}</b><br>{html.escape(label)}</span>" for label, value in figures)
    return f'<p class="headline">{spans}</p>'


def _number(value) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _percent(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _utilization_chart(capacity: pa.Table) -> go.Figure:
    fleet = capacity.filter(pc.and_(pc.is_valid(capacity["hour"]), pc.equal(capacity["pod"], "(all)")))
    hours = _iso(fleet["hour"])
    figure = go.Figure()
    for column, label, colour in (
        ("busy_gpus", "busy in recognized jobs", "#2b7bba"),
        ("traffic_only_gpus", "traffic outside jobs", "#f0a030"),
        ("no_traffic_gpus", "no traffic (idle or unobservable)", "#c8c8c8"),
    ):
        figure.add_bar(x=hours, y=fleet[column].to_pylist(), name=label, marker_color=colour)
    figure.update_layout(barmode="stack", yaxis_title="GPUs (hour average)", xaxis_title="hour (UTC)")
    return figure


def _waste_chart(waste: pa.Table) -> go.Figure:
    by_kind = waste.filter(pc.and_(pc.equal(waste["job_id"], "(all)"), pc.not_equal(waste["kind"], "(all)")))
    figure = go.Figure()
    for kind in sorted(set(by_kind["kind"].to_pylist())):
        rows = by_kind.filter(pc.equal(by_kind["kind"], kind))
        figure.add_bar(x=_iso(rows["period"]), y=rows["wasted_gpu_h"].to_pylist(), name=kind,
                       marker_color=ISSUE_COLOURS.get(kind, OTHER_COLOUR))
    figure.update_layout(barmode="stack", yaxis_title="GPU-hours wasted", xaxis_title="hour (UTC)")
    return figure


def _step_time_chart(steps: pa.Table, issues: pa.Table, jobs: pa.Table) -> go.Figure:
    """Step time against step start, one job at a time (a menu picks the job), with the job's
    issues shaded."""
    with_steps = set(steps["job_id"].to_pylist())
    chosen = [j for j in jobs["job_id"].to_pylist() if j in with_steps][:STEP_CHART_JOBS]
    figure = go.Figure()
    buttons = []
    for n, job_id in enumerate(chosen):
        x, y, step = _series_by_attempt(steps.filter(pc.equal(steps["job_id"], job_id)))
        figure.add_scatter(
            x=x, y=y, mode="lines+markers", marker_size=4, name=job_id, visible=n == 0,
            customdata=step, hovertemplate="step %{customdata}: %{y:.3f} s<extra></extra>",
        )
        shapes = _issue_shapes(issues.filter(pc.equal(issues["job_id"], job_id)))
        buttons.append({
            "label": job_id,
            "method": "update",
            "args": [{"visible": [k == n for k in range(len(chosen))]},
                     {"shapes": shapes, "title.text": f"step times of {job_id}"}],
        })
    figure.update_layout(
        title=f"step times of {chosen[0]}" if chosen else "no steps in the range",
        shapes=buttons[0]["args"][1]["shapes"] if buttons else [],
        updatemenus=[{"buttons": buttons, "x": 1.0, "xanchor": "right", "y": 1.15}] if buttons else [],
        xaxis_title="step start (UTC)", yaxis_title="step time (s)",
    )
    return figure


def _series_by_attempt(rows: pa.Table) -> tuple[list, list, list]:
    """Step start, duration and number, with a gap (None) where a restart begins a new attempt,
    so the line does not bridge the downtime."""
    x, y, step = [], [], []
    previous = None
    for started, row in zip(_iso(rows["started"]), rows.select(["attempt", "duration_s", "step"]).to_pylist()):
        if previous is not None and row["attempt"] != previous:
            for column in (x, y, step):
                column.append(None)
        x.append(started)
        y.append(row["duration_s"])
        step.append(row["step"])
        previous = row["attempt"]
    return x, y, step


# One colour per issue kind and per job status in every report and chart, whatever kinds a
# report happens to show.
ISSUE_COLOURS = {
    "straggler": "#d62728", "slow_link": "#9467bd", "hang": "#000000", "restart": "#ff7f0e",
    "degradation": "#8c564b", "slow_step": "#e377c2", "analysis_error": "#17becf",
}
STATUS_COLOURS = {"running": "#2b7bba", "ended": "#9e9e9e", "hung": "#000000"}
OTHER_COLOUR = "#7f7f7f"


def _issue_shapes(issues: pa.Table) -> list[dict]:
    """A shaded band per issue over its interval (a line for an instant), labelled with its kind."""
    shapes = []
    for kind, start, end in zip(issues["kind"].to_pylist(), _iso(issues["started"]), _iso(issues["ended"])):
        shapes.append({
            "type": "rect", "xref": "x", "yref": "paper", "x0": start, "x1": end, "y0": 0, "y1": 1,
            "fillcolor": ISSUE_COLOURS.get(kind, OTHER_COLOUR), "opacity": 0.15, "line": {"width": 1},
            "label": {"text": kind, "textposition": "top left", "font": {"size": 10}},
        })
    return shapes


def _gantt_chart(jobs: pa.Table, issues: pa.Table) -> go.Figure:
    """One bar per job from its first traffic until it released its GPUs, coloured by status, with
    its issues marked where they start."""
    figure = go.Figure()
    order = jobs.sort_by([("started", "ascending"), ("job_id", "ascending")])
    for status in sorted(set(order["status"].to_pylist())):
        rows = order.filter(pc.equal(order["status"], status))
        held_ms = pc.divide(pc.subtract(rows["held_until"], rows["started"]).cast(pa.int64()), 1_000_000)
        figure.add_bar(
            y=rows["job_id"].to_pylist(), x=held_ms.to_pylist(), base=_iso(rows["started"]), orientation="h",
            name=status, customdata=rows["n_gpus"].to_pylist(), marker_color=STATUS_COLOURS.get(status, OTHER_COLOUR),
            hovertemplate="%{y}: %{customdata} GPUs<extra>" + status + "</extra>",
        )
    alive = issues.filter(pc.is_in(issues["job_id"], value_set=jobs["job_id"]))
    figure.add_scatter(
        x=_iso(alive["started"]), y=alive["job_id"].to_pylist(), mode="markers", name="issues",
        marker={"symbol": "x", "size": 9, "color": [ISSUE_COLOURS.get(k, OTHER_COLOUR) for k in alive["kind"].to_pylist()]},
        text=alive["kind"].to_pylist(), hovertemplate="%{y}: %{text}<extra></extra>",
    )
    figure.update_layout(
        xaxis={"type": "date", "title": "UTC"},
        yaxis={"categoryorder": "array", "categoryarray": order["job_id"].to_pylist()[::-1]},
        height=max(300, 22 * order.num_rows + 120), barmode="overlay",
    )
    return figure


def _waste_by_job(waste: pa.Table) -> pa.Table:
    """One row per job, one column per issue kind, GPU-hours over the whole range."""
    per_job = waste.filter(pc.and_(pc.not_equal(waste["job_id"], "(all)"), pc.not_equal(waste["kind"], "(all)")))
    totals = per_job.group_by(["job_id", "kind"]).aggregate([("wasted_gpu_h", "sum")])
    kinds = sorted(set(totals["kind"].to_pylist()))
    cells: dict[str, dict[str, float]] = {}
    for row in totals.to_pylist():
        cells.setdefault(row["job_id"], {})[row["kind"]] = row["wasted_gpu_h_sum"]
    job_ids = sorted(cells, key=lambda j: -sum(cells[j].values()))
    columns = {"job_id": job_ids, "total": [sum(cells[j].values()) for j in job_ids]}
    columns |= {kind: [cells[j].get(kind, 0.0) for j in job_ids] for kind in kinds}
    return pa.table(columns)


def _iso(column: pa.ChunkedArray | pa.Array) -> list[str | None]:
    """Instants as ISO-8601 UTC text without a zone, which plotly reads as the axis' own time."""
    return pc.strftime(_micros(column), format="%Y-%m-%dT%H:%M:%S").to_pylist()


def _micros(column: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """Instants truncated to microseconds (DuckDB gives the warehouse's nanoseconds), UTC."""
    return pc.cast(column, pa.timestamp("us", "UTC"), safe=False)


def _table_section(heading: str, table: pa.Table) -> str:
    header = "".join(f"<th>{html.escape(name)}</th>" for name in table.column_names)
    kinds = [_cell_kind(table.schema.field(name).type) for name in table.column_names]
    rows = []
    columns = [_micros(table[name]) if kind == "time" else table[name] for name, kind in zip(table.column_names, kinds)]
    for values in zip(*(column.to_pylist() for column in columns)):
        cells = "".join(_cell(value, kind) for value, kind in zip(values, kinds))
        rows.append(f"<tr>{cells}</tr>")
    body = "\n".join(rows) if rows else f'<tr><td class="text" colspan="{table.num_columns}">none</td></tr>'
    return f'<h2>{html.escape(heading)}</h2>\n<div class="table"><table><tr>{header}</tr>\n{body}</table></div>'


def _cell_kind(data_type: pa.DataType) -> str:
    if pa.types.is_floating(data_type) or pa.types.is_decimal(data_type):
        return "float"
    if pa.types.is_integer(data_type):
        return "int"
    if pa.types.is_timestamp(data_type):
        return "time"
    return "text"


def _cell(value, kind: str) -> str:
    if value is None:
        text = ""
    elif kind == "float":
        text = f"{float(value):,.3f}" if abs(value) < 1000 else f"{float(value):,.0f}"
    elif kind == "int":
        text = f"{value:,}"
    elif kind == "time":
        text = value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    else:
        text = value if isinstance(value, str) else json.dumps(value)
    css = ' class="text"' if kind in ("text", "time") else ""
    return f"<td{css}>{html.escape(text)}</td>"
