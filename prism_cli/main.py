"""`prism`: simulate a cluster, run the hourly pipeline, score it, and explore the warehouse."""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn,
)
from rich.table import Table

# Beam's optional cloud modules log warnings at import that say nothing about a Prism run.
logging.getLogger().setLevel(logging.ERROR)

app = typer.Typer(
    help="Prism: training-job observability for GPU platforms, from network flow logs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = Console()
errors = Console(stderr=True)
BEAM_ARGS = {"allow_extra_args": True, "ignore_unknown_options": True}


def fail(message: str) -> None:
    """A user error: one line on stderr, exit code 2."""
    errors.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True, highlight=False)
    raise typer.Exit(code=2)


def check_range(first: datetime | None, end: datetime | None) -> None:
    if first is not None and end is not None and end <= first:
        fail(f"the range is empty: --to/--end {end:%Y-%m-%d %H:%M} is not after its start {first:%Y-%m-%d %H:%M}")


WAREHOUSE_HELP = "Warehouse directory, or object store prefix (s3://bucket/prefix; docs/object-storage.md)"


def check_warehouse(location: str) -> None:
    """A local warehouse is a directory, or a path one can be made at (an object store prefix
    always can be)."""
    if "://" in location:
        return
    warehouse = Path(location)
    existing = next((p for p in (warehouse, *warehouse.parents) if p.exists()), None)
    if warehouse.exists() and not warehouse.is_dir():
        fail(f"--warehouse {warehouse} is a file, not a directory")
    if existing is not None and not existing.is_dir():
        fail(f"--warehouse {warehouse}: {existing} is a file, not a directory")


def parse_instant(text: str | None) -> datetime | None:
    """ISO-8601 date and time; UTC unless it names a zone."""
    if text is None:
        return None
    try:
        instant = datetime.fromisoformat(text)
    except ValueError:
        fail(f"not a date and time: {text!r} (expected e.g. 2026-11-22T05:00)")
    return instant.replace(tzinfo=timezone.utc) if instant.tzinfo is None else instant


def progress_bar(unit: str) -> Progress:
    """Steps done of the total (`unit`: what a step is), elapsed and remaining time."""
    return Progress(
        SpinnerColumn(),
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(unit),
        TimeElapsedColumn(),
        TextColumn("left"),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    )


@app.command()
def simulate(
    out: Annotated[Path, typer.Option(help="Directory for flows/, topology.csv and truth/")],
    scenario: Annotated[str, typer.Option(help="tiny, small, fleet, dense, realistic, sealed, replay-ar, replay-st or replay-mix")] = "tiny",
    seed: Annotated[int, typer.Option(help="Random seed; the same seed gives the same files")] = 0,
    format: Annotated[str, typer.Option(help="parquet, jsonl or jsonl.gz")] = "parquet",
    whatif: Annotated[Optional[Path], typer.Option(help="Real traces the replay-* scenarios read "
                                                   "(default: ../shared/data/whatif beside the repository)")] = None,
) -> None:
    """Simulate a GPU cluster's flow logs, with the ground truth to score Prism against."""
    from prism_core.simulate import FORMATS, SCENARIOS, write_scenario
    from prism_core.simulate.replay import TraceError

    if scenario not in SCENARIOS:
        fail(f"unknown scenario {scenario!r}; choose one of {', '.join(SCENARIOS)}")
    if format not in FORMATS:
        fail(f"unknown format {format!r}; choose one of {', '.join(FORMATS)}")
    if out.exists() and not out.is_dir():
        fail(f"--out {out} is a file, not a directory")
    with progress_bar("simulated minutes") as progress:
        task = progress.add_task(f"simulating {scenario}", total=SCENARIOS[scenario].minutes)
        try:
            summary = write_scenario(
                scenario, out, seed, fmt=format, whatif_dir=whatif,
                progress=lambda done, total: progress.update(task, completed=done, total=total),
            )
        except TraceError as error:
            fail(str(error))
    console.print(
        f"[green]simulated[/] {summary.records:,} flow records ({summary.malformed:,} malformed, "
        f"{summary.duplicates:,} duplicates) of {summary.jobs} jobs into {out} "
        f"in {summary.seconds:.1f} s"
    )
    if summary.single_host_jobs:
        console.print(
            f"{summary.single_host_jobs} of the {summary.jobs} jobs run on one host, where their traffic stays "
            f"on NVLink: flow logs show {summary.jobs - summary.single_host_jobs} jobs, and the truth Prism is "
            "scored against counts only those"
        )


@app.command(context_settings=BEAM_ARGS)
def run(
    ctx: typer.Context,
    flows: Annotated[str, typer.Option(help="Directory (or object store prefix) of flow files (Parquet, goflow2 JSONL, CSV)")],
    warehouse: Annotated[str, typer.Option(help=WAREHOUSE_HELP)] = "prism-warehouse",
    topology: Annotated[Optional[Path], typer.Option(help="NIC inventory CSV")] = None,
    no_topology: Annotated[bool, typer.Option(help="Run without an inventory: every address its own host")] = False,
    start: Annotated[Optional[str], typer.Option(help="First hour (UTC); default: first flow")] = None,
    end: Annotated[Optional[str], typer.Option(help="End, exclusive; default: after the last flow")] = None,
    config: Annotated[
        Optional[Path], typer.Option(help="TOML file overriding inference thresholds ([stage] field = value)")
    ] = None,
) -> None:
    """Run every stage for each hour in range. Extra arguments go to Beam (e.g. --runner)."""
    from pipelines.run import RunError, infer_range
    from prism_core.config import DEFAULT_PARAMS, ConfigError, load_params

    check_warehouse(warehouse)
    try:
        params = load_params(config) if config else DEFAULT_PARAMS
    except ConfigError as error:
        fail(str(error))
    try:
        first, last = parse_instant(start), parse_instant(end)
        check_range(first, last)
        if first is None or last is None:
            console.print("finding the time range of the flows ...")
            found_first, found_last = infer_range(flows)
            first, last = first or found_first, last or found_last
        summary = _run_with_progress(flows, warehouse, first, last, topology, ctx.args, no_topology, params)
    except RunError as error:
        fail(str(error))
    _print_run(summary, warehouse)


def _run_with_progress(flows, warehouse, first, last, topology, beam_args, no_topology=False, params=None):
    from pipelines.run import run_hours
    from pipelines.warehouse import hours_between
    from prism_core.config import DEFAULT_PARAMS

    # run_hours reports its stages in order: checking the input, ingest, recognition and analysis
    # of each hour, warehouse.
    stages = 2 * len(hours_between(first, last)) + 3
    finished = iter(range(stages))  # stages done when the next one starts
    with progress_bar("stages") as progress:
        task = progress.add_task("starting", total=stages)
        summary = run_hours(
            flows, warehouse, first, last,
            topology_path=str(topology) if topology else None,
            no_topology=no_topology,
            beam_args=beam_args,
            params=params or DEFAULT_PARAMS,
            on_stage=lambda stage: progress.update(task, description=stage, completed=next(finished)),
        )
        progress.update(task, description="done", completed=stages)
        return summary


def _print_run(summary, warehouse: str) -> None:
    table = Table(title="rows written per hour")
    table.add_column("table")
    for hour in summary.per_hour:
        table.add_column(hour, justify="right")
    names = sorted({name for counts in summary.per_hour.values() for name in (counts or {})})
    for name in names:
        table.add_row(name, *[f"{(counts or {}).get(name, 0):,}" for counts in summary.per_hour.values()])
    console.print(table)
    counters = summary.counters
    if counters:  # none from a runner that collects no metrics (a warning says so)
        console.print(
            f"read {counters.get('rows_read', 0):,} records from {counters.get('files', 0)} files: "
            f"{counters.get('flows', 0):,} flows, {counters.get('quarantined', 0):,} quarantined, "
            f"{counters.get('duplicates', 0):,} duplicates, {counters.get('out_of_range', 0):,} outside the range"
        )
    for warning in summary.warnings:
        console.print(f"[bold yellow]warning:[/] {warning}", soft_wrap=True)
    if counters.get("analysis_errors"):
        console.print(
            f"[yellow]{counters['analysis_errors']} job analyses failed[/]: each is an analysis_error row of "
            "issues, naming the stage and the exception"
        )
    duckdb_hint = (f"duckdb -readonly {warehouse}/prism.duckdb" if "://" not in warehouse
                   else "ATTACH it through httpfs: docs/object-storage.md")
    console.print(f"warehouse: {warehouse}/  (DuckDB: {duckdb_hint})")


@app.command()
def evaluate(
    truth: Annotated[Path, typer.Option(help="The simulator's truth/ directory")],
    warehouse: Annotated[str, typer.Option(help=WAREHOUSE_HELP)] = "prism-warehouse",
    as_json: Annotated[bool, typer.Option("--json", metavar="", help="Print the figures as JSON")] = False,
    fail_on_miss: Annotated[
        bool, typer.Option("--fail/--no-fail", help="Exit 1 when a figure misses its target (--no-fail: report only)")
    ] = True,
) -> None:
    """Score the warehouse against simulator truth, stage by stage."""
    from pipelines.evaluation import EvaluationError, evaluate_warehouse

    try:
        scores = evaluate_warehouse(truth, warehouse)
    except EvaluationError as error:
        fail(str(error))
    if as_json:
        print(json.dumps(scores, indent=2, sort_keys=True))
    else:
        _print_scores(scores)
    missed = [f"{stage}.{name}" for stage, metrics in scores.items() for name, figure in metrics.items()
              if figure.get("ok") is False]
    if missed and fail_on_miss:
        # on stderr, so that --json output stays JSON
        typer.secho(f"{len(missed)} figures miss their target: {', '.join(missed)}", fg="red", err=True)
        raise typer.Exit(code=1)


def _print_scores(scores: dict) -> None:
    table = Table(title="accuracy against simulator truth")
    for column in ("stage", "metric", "value", "target", "ok"):
        table.add_column(column, justify="right" if column in ("value", "target") else "left")
    for stage, metrics in scores.items():
        for name, figure in metrics.items():
            value, target = figure["value"], figure.get("target")
            ok = "" if target is None or figure.get("ok") is None else ("yes" if figure["ok"] else "[red]NO[/]")
            shown = "n/a" if value is None else f"{value:.4f}" if isinstance(value, float) else str(value)
            if "count" in figure:
                shown += f" ({figure['count']}/{figure['of']})"
            bound = "" if target is None else f"{'<=' if figure.get('at_most') else '>='} {target}"
            table.add_row(stage, name, shown, bound, ok)
    console.print(table)


@app.command()
def report(
    warehouse: Annotated[str, typer.Option(help=WAREHOUSE_HELP)] = "prism-warehouse",
    start: Annotated[Optional[str], typer.Option("--from", help="First instant (UTC)")] = None,
    end: Annotated[Optional[str], typer.Option("--to", help="End, exclusive (UTC)")] = None,
    out: Annotated[Path, typer.Option(help="HTML file")] = Path("prism-report.html"),
    topology: Annotated[Optional[Path], typer.Option(help="NIC inventory CSV (default: the run's)")] = None,
) -> None:
    """Fleet and job report (charts and tables) as one self-contained HTML file."""
    from pipelines.reports import ReportError, build_report

    first, last = parse_instant(start), parse_instant(end)
    check_range(first, last)
    try:
        path = build_report(warehouse, first, last, out, topology=topology)
    except ReportError as error:
        fail(str(error))
    console.print(f"[green]report[/] {path}")


@app.command("export-trace")
def export_trace(
    job: Annotated[str, typer.Option(help="job_id")],
    warehouse: Annotated[str, typer.Option(help=WAREHOUSE_HELP)] = "prism-warehouse",
    out: Annotated[Path, typer.Option(help="Trace JSON file")] = Path("trace.json"),
) -> None:
    """One job's timeline (attempts, steps, DP sync, issues) as trace-event JSON for Perfetto."""
    from pipelines.reports import ReportError
    from pipelines.trace import export_trace as write_trace

    try:
        path = write_trace(warehouse, job, out)
    except ReportError as error:
        fail(str(error))
    console.print(f"[green]trace[/] {path}: open it in Perfetto (ui.perfetto.dev, Open trace file)")


@app.command()
def demo(
    data: Annotated[Path, typer.Option(help="Where the simulated cluster is written")] = Path("prism-data"),
    warehouse: Annotated[str, typer.Option(help=WAREHOUSE_HELP)] = "prism-warehouse",
    scenario: Annotated[str, typer.Option(help="Simulator scenario")] = "tiny",
) -> None:
    """Simulate a small cluster, run the pipeline on the DirectRunner, and score the result."""
    simulate(out=data / scenario, scenario=scenario, seed=0, format="parquet")
    from pipelines.run import RunError, infer_range

    try:
        first, last = infer_range(str(data / scenario / "flows"))
        summary = _run_with_progress(
            str(data / scenario / "flows"), warehouse, first, last, data / scenario / "topology.csv", []
        )
    except RunError as error:
        fail(str(error))
    _print_run(summary, warehouse)
    evaluate(truth=data / scenario / "truth", warehouse=warehouse, as_json=False, fail_on_miss=False)
    console.print(
        "\nNext:\n"
        f"  prism report --warehouse {warehouse} --out prism-report.html   (charts and tables)\n"
        f"  python -c \"import duckdb; print(duckdb.connect('{warehouse}/prism.duckdb', read_only=True)"
        ".sql('SELECT job_id, n_gpus, dp, pp, tp, status FROM job_latest'))\"\n"
        f"  or any DuckDB client: duckdb -readonly {warehouse}/prism.duckdb",
        soft_wrap=True,
    )


if __name__ == "__main__":
    app()
