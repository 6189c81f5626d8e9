"""`prism`: simulate a cluster, run the hourly pipeline, score it, and explore the warehouse."""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

# Beam's optional cloud modules log warnings at import that say nothing about a Prism run.
logging.getLogger().setLevel(logging.ERROR)

app = typer.Typer(
    help="Prism: training-job observability for GPU platforms, from network flow logs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = Console()
BEAM_ARGS = {"allow_extra_args": True, "ignore_unknown_options": True}


def fail(message: str) -> None:
    console.print(f"[bold red]error:[/] {message}", soft_wrap=True)
    raise typer.Exit(code=2)


def parse_instant(text: str | None) -> datetime | None:
    """ISO-8601 date and time; UTC unless it names a zone."""
    if text is None:
        return None
    try:
        instant = datetime.fromisoformat(text)
    except ValueError:
        fail(f"not a date and time: {text!r} (expected e.g. 2026-11-22T05:00)")
    return instant.replace(tzinfo=timezone.utc) if instant.tzinfo is None else instant


def progress_bar() -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


@app.command()
def simulate(
    out: Annotated[Path, typer.Option(help="Directory for flows/, topology.csv and truth/")],
    scenario: Annotated[str, typer.Option(help="tiny, small, fleet, sealed, replay-ar, replay-st or replay-mix")] = "tiny",
    seed: Annotated[int, typer.Option(help="Random seed; the same seed gives the same files")] = 0,
    format: Annotated[str, typer.Option(help="parquet, jsonl or jsonl.gz")] = "parquet",
    whatif: Annotated[Optional[Path], typer.Option(help="Real traces the replay-* scenarios read "
                                                   "(default: ../shared/data/whatif beside the repository)")] = None,
) -> None:
    """Simulate a GPU cluster's flow logs, with the ground truth to score Prism against."""
    from prism_core.simulate import SCENARIOS, write_scenario
    from prism_core.simulate.replay import TraceError

    if scenario not in SCENARIOS:
        fail(f"unknown scenario {scenario!r}; choose one of {', '.join(SCENARIOS)}")
    with progress_bar() as progress:
        task = progress.add_task(f"simulating {scenario}", total=None)
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


@app.command(context_settings=BEAM_ARGS)
def run(
    ctx: typer.Context,
    flows: Annotated[str, typer.Option(help="Directory of flow files (Parquet, goflow2 JSONL, CSV)")],
    warehouse: Annotated[Path, typer.Option(help="Warehouse directory")] = Path("prism-warehouse"),
    topology: Annotated[Optional[Path], typer.Option(help="NIC inventory CSV")] = None,
    start: Annotated[Optional[str], typer.Option(help="First hour (UTC); default: first flow")] = None,
    end: Annotated[Optional[str], typer.Option(help="End, exclusive; default: after the last flow")] = None,
) -> None:
    """Run every stage for each hour in range. Extra arguments go to Beam (e.g. --runner)."""
    from pipelines.run import RunError, infer_range, run_hours

    try:
        first, last = parse_instant(start), parse_instant(end)
        if first is None or last is None:
            console.print("finding the time range of the flows ...")
            found_first, found_last = infer_range(flows)
            first, last = first or found_first, last or found_last
        summary = _run_with_progress(flows, warehouse, first, last, topology, ctx.args)
    except RunError as error:
        fail(str(error))
    _print_run(summary, warehouse)


def _run_with_progress(flows, warehouse, first, last, topology, beam_args):
    from pipelines.run import run_hours

    with progress_bar() as progress:
        task = progress.add_task("starting", total=None)
        return run_hours(
            flows, str(warehouse), first, last,
            topology_path=str(topology) if topology else None,
            beam_args=beam_args,
            on_stage=lambda stage: progress.update(task, description=stage),
        )


def _print_run(summary, warehouse: Path) -> None:
    table = Table(title="rows written per hour")
    table.add_column("table")
    for hour in summary.per_hour:
        table.add_column(hour, justify="right")
    names = sorted({name for counts in summary.per_hour.values() for name in (counts or {})})
    for name in names:
        table.add_row(name, *[f"{(counts or {}).get(name, 0):,}" for counts in summary.per_hour.values()])
    console.print(table)
    counters = summary.counters
    console.print(
        f"read {counters.get('rows_read', 0):,} records from {counters.get('files', 0)} files: "
        f"{counters.get('flows', 0):,} flows, {counters.get('quarantined', 0):,} quarantined, "
        f"{counters.get('duplicates', 0):,} duplicates, {counters.get('out_of_range', 0):,} outside the range"
    )
    console.print(f"warehouse: {warehouse}/  (DuckDB: duckdb -readonly {warehouse}/prism.duckdb)")


@app.command()
def evaluate(
    truth: Annotated[Path, typer.Option(help="The simulator's truth/ directory")],
    warehouse: Annotated[Path, typer.Option(help="Warehouse directory")] = Path("prism-warehouse"),
    as_json: Annotated[bool, typer.Option("--json", help="Print the figures as JSON")] = False,
) -> None:
    """Score the warehouse against simulator truth, stage by stage."""
    from pipelines.evaluation import EvaluationError, evaluate_warehouse

    try:
        scores = evaluate_warehouse(truth, warehouse)
    except EvaluationError as error:
        fail(str(error))
    if as_json:
        print(json.dumps(scores, indent=2, sort_keys=True))
        return
    _print_scores(scores)


def _print_scores(scores: dict) -> None:
    table = Table(title="accuracy against simulator truth")
    for column in ("stage", "metric", "value", "target", "ok"):
        table.add_column(column, justify="right" if column in ("value", "target") else "left")
    for stage, metrics in scores.items():
        for name, figure in metrics.items():
            value, target = figure["value"], figure.get("target")
            ok = "" if target is None or figure.get("ok") is None else ("yes" if figure["ok"] else "[red]NO[/]")
            shown = "n/a" if value is None else f"{value:.4f}" if isinstance(value, float) else str(value)
            table.add_row(stage, name, shown, "" if target is None else str(target), ok)
    console.print(table)


@app.command()
def report(
    warehouse: Annotated[Path, typer.Option(help="Warehouse directory")] = Path("prism-warehouse"),
    start: Annotated[Optional[str], typer.Option("--from", help="First instant (UTC)")] = None,
    end: Annotated[Optional[str], typer.Option("--to", help="End, exclusive (UTC)")] = None,
    out: Annotated[Path, typer.Option(help="HTML file")] = Path("prism-report.html"),
    topology: Annotated[Optional[Path], typer.Option(help="NIC inventory CSV (default: the run's)")] = None,
) -> None:
    """Fleet and job report (charts and tables) as one self-contained HTML file."""
    from pipelines.reports import ReportError, build_report

    try:
        path = build_report(warehouse, parse_instant(start), parse_instant(end), out, topology=topology)
    except ReportError as error:
        fail(str(error))
    console.print(f"[green]report[/] {path}")


@app.command("export-trace")
def export_trace(
    job: Annotated[str, typer.Option(help="job_id")],
    warehouse: Annotated[Path, typer.Option(help="Warehouse directory")] = Path("prism-warehouse"),
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
    warehouse: Annotated[Path, typer.Option(help="Warehouse directory")] = Path("prism-warehouse"),
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
    evaluate(truth=data / scenario / "truth", warehouse=warehouse, as_json=False)
    console.print(
        "\nNext:\n"
        f"  prism report --warehouse {warehouse} --out prism-report.html   (charts and tables)\n"
        f"  python -c \"import duckdb; print(duckdb.connect('{warehouse}/prism.duckdb', read_only=True)"
        ".sql('SELECT * FROM jobs'))\"\n"
        f"  or any DuckDB client: duckdb -readonly {warehouse}/prism.duckdb",
        soft_wrap=True,
    )


if __name__ == "__main__":
    app()
