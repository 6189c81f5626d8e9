"""Every command in the fenced `bash` blocks of README.md and docs/*.md runs as written.

Fast: each command parses (`bash -n`) and every `prism SUBCOMMAND --flag` it uses exists. Slow:
each document's commands run in order, as one shell script, in a copy of the repository where
`prism demo` has already written the demo data, and print none of the warnings issue #20 removed.
"""

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import typer.main

from prism_cli.main import app

REPO = Path(__file__).resolve().parent.parent
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# Commands the slow test does not run, each with the reason. Exact text, so that a changed
# command has to be looked at again (test_every_command_not_run_is_still_in_the_docs).
NOT_RUN = {
    "pip install -e . && prism demo": "installs into the environment running the tests; the copy runs `prism demo` first",
    "pip install -e '.[test]' && python -m pytest": "the test suite itself",
    # Long-lived servers: tests/test_dagster_ui.py starts `dg dev`, queries it and stops it.
    "PRISM_PARTITION_END_OFFSET=12 dg dev": "a server (tests/test_dagster_ui.py)",
}
# Printed by Beam's GCP module at import and by Dagster's superseded commands (issue #20).
NOISE = ("apitools not found", "SupersessionWarning")


def bash_blocks(document: Path) -> list[tuple[int, str]]:
    """(line of the block's first command, its text) for each ```bash block."""
    text = document.read_text()
    return [
        (text[: match.start(1)].count("\n") + 1, match.group(1))
        for match in re.finditer(r"^```bash\n(.*?)^```", text, re.S | re.M)
    ]


def commands(document: Path) -> list[tuple[int, str]]:
    """(line, command) of each command: a line with its backslash continuations, without
    comment-only lines."""
    found = []
    for first, block in bash_blocks(document):
        lines = block.splitlines()
        index = 0
        while index < len(lines):
            start, command = index, lines[index]
            while command.endswith("\\"):
                index += 1
                command += "\n" + lines[index]
            index += 1
            if command.strip() and not command.lstrip().startswith("#"):
                found.append((first + start, command))
    return found


def without_comment(command: str) -> str:
    return command.split("  #", 1)[0].strip()


ALL_COMMANDS = [(document, line, command) for document in DOCUMENTS for line, command in commands(document)]
IDS = [f"{document.name}:{line}" for document, line, _ in ALL_COMMANDS]


def test_the_docs_have_commands():
    # README's quick start, warehouse, report and Dagster blocks; analysts' report and trace;
    # orchestration's runners, UI and command line.
    assert {document.name for document, _, _ in ALL_COMMANDS} == {"README.md", "analysts.md", "orchestration.md"}
    assert len(ALL_COMMANDS) >= 20


@pytest.mark.parametrize(("document", "line", "command"), ALL_COMMANDS, ids=IDS)
def test_command_parses(document, line, command):
    result = subprocess.run(["bash", "-n"], input=command, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def prism_uses(command: str) -> list[tuple[str, list[str]]]:
    """(subcommand, its --flags) for each `prism SUBCOMMAND ...` in `command`, up to the next
    shell operator."""
    words = shlex.split(without_comment(command).replace("\\\n", " "), posix=True)
    uses = []
    for index, word in enumerate(words):
        if word == "prism" and index + 1 < len(words):
            flags = []
            for later in words[index + 2:]:
                if later in ("&&", "||", ";", "|"):
                    break
                if later.startswith("--"):
                    flags.append(later.split("=", 1)[0])
            uses.append((words[index + 1], flags))
    return uses


PRISM_USES = [(f"{document.name}:{line}", use) for document, line, command in ALL_COMMANDS
              for use in prism_uses(command)]


def test_the_docs_use_prism_commands():
    assert {sub for _, (sub, _) in PRISM_USES} >= {"demo", "report", "export-trace"}


@pytest.mark.parametrize(("where", "use"), PRISM_USES, ids=[f"{where}:{use[0]}" for where, use in PRISM_USES])
def test_prism_subcommand_and_flags_exist(where, use):
    """Against the click command that `prism SUBCOMMAND --help` prints."""
    subcommand, flags = use
    group = typer.main.get_command(app)
    assert subcommand in group.commands, f"{where}: prism has no {subcommand}"
    known = {option for param in group.commands[subcommand].params for option in param.opts + param.secondary_opts}
    assert set(flags) <= known, f"{where}: prism {subcommand} has no {sorted(set(flags) - known)}"


def test_every_command_not_run_is_still_in_the_docs():
    written = {without_comment(command) for _, _, command in ALL_COMMANDS}
    assert set(NOT_RUN) <= written, set(NOT_RUN) - written


@pytest.fixture(scope="module")
def demo_checkout(tmp_path_factory) -> tuple[Path, dict]:
    """A copy of the repository (as a user's checkout) with the demo data, and the environment
    to run commands in it: Python imports the copy, `prism` is the installed script if there
    is one, else `python -m prism_cli.main`."""
    checkout = tmp_path_factory.mktemp("docs") / "prism"
    shutil.copytree(REPO, checkout, ignore=shutil.ignore_patterns(".git", "__pycache__", "*.egg-info", ".dagster",
                                                                  "prism-data", "prism-warehouse"))
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PRISM_", "DAGSTER_"))}
    env["PYTHONPATH"] = str(checkout)
    if shutil.which("prism") is None:
        shim = checkout.parent / "bin"
        shim.mkdir()
        (shim / "prism").write_text('#!/bin/sh\nexec python -m prism_cli.main "$@"\n')
        (shim / "prism").chmod(0o755)
        env["PATH"] = f"{shim}{os.pathsep}{env['PATH']}"
    demo = subprocess.run(["prism", "demo"], cwd=checkout, env=env, capture_output=True, text=True, timeout=600)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    return checkout, env


@pytest.mark.slow
@pytest.mark.parametrize("document", [d for d in DOCUMENTS if commands(d)], ids=lambda d: d.name)
def test_document_commands_run_as_written(document, demo_checkout, tmp_path):
    checkout, env = demo_checkout
    workdir = tmp_path / "prism"
    shutil.copytree(checkout, workdir)
    env = {**env, "PYTHONPATH": str(workdir)}
    # One script per document, so that an `export` holds for the commands after it; a marker
    # before each command says which one failed.
    script = ["set -euo pipefail"]
    for line, command in commands(document):
        if without_comment(command) not in NOT_RUN:
            script += [f"echo '>>> {document.name}:{line}' >&2", command]
    result = subprocess.run(["bash", "-c", "\n".join(script)], cwd=workdir, env=env,
                            capture_output=True, text=True, timeout=1200)
    output = result.stdout + result.stderr
    assert result.returncode == 0, result.stderr[-4000:]
    assert not [noise for noise in NOISE if noise in output], output[-4000:]
