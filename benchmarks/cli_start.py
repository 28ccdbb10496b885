"""How long ``dueflow --help`` and ``dueflow status`` take, before and after a change: the two
source trees run alternately, run by run, so a load that comes and goes hits both alike.

``--before REV`` is a git revision whose ``src/`` is exported to a temporary directory; the
after tree is this checkout's ``src/``. ``status`` reads a migrated SQLite file made for the run.
Also prints ``python -X importtime``'s cumulative time of ``import dueflow.cli`` for each tree.
Run: ``.venv/bin/python benchmarks/cli_start.py --before 3c09ac8 --runs 40``.

``--database-url URL`` runs ``status`` against that database instead (both trees; migrated
already, e.g. the million orders of ``benchmarks/seed_orders.py``), and also times, alternately,
what is not the command's work: ``python -c pass`` (the interpreter) and a Python importing
what ``status`` imports on that database and doing nothing (:data:`STATUS_IMPORTS`); the rest of
``status``' wall time is its settings, connections, reads and output.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DUEFLOW = Path(sys.executable).parent / "dueflow"
#: What ``dueflow status`` imports on PostgreSQL (its command, the settings, the adapters it
#: wires, the reads and the driver), without running anything.
STATUS_IMPORTS = (
    "import dueflow.cli, dueflow.cli.status, dueflow.config, dueflow.bootstrap, "
    "dueflow.service.report, dueflow.render, sqlalchemy.dialects.postgresql.asyncpg, asyncpg"
)


def python(src: Path, code: str) -> float:
    """Seconds ``python -c CODE`` takes with ``src`` first on the path."""
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(src)}, check=True
    )
    return time.perf_counter() - start


def export(rev: str, into: Path) -> Path:
    """``src/`` of ``rev`` under ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "src"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "src"


def wall(src: Path, args: list[str], env: dict[str, str]) -> float:
    """Seconds one ``dueflow ARGS`` takes with ``src`` first on the path."""
    start = time.perf_counter()
    subprocess.run(
        [str(DUEFLOW), *args],
        env={**env, "PYTHONPATH": str(src)},
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


def import_ms(src: Path) -> float:
    """``-X importtime``'s cumulative microseconds of ``import dueflow.cli``, in ms."""
    found = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import dueflow.cli"],
        env={**os.environ, "PYTHONPATH": str(src)},
        capture_output=True,
        text=True,
        check=True,
    ).stderr.splitlines()
    line = [text for text in found if text.endswith("| dueflow.cli")][-1]
    return int(line.split("|")[1]) / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--before", required=True, help="git revision of the before tree")
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--database-url", help="status against this (migrated) database")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"before": export(opts.before, Path(tmp)), "after": ROOT / "src"}
        clean = {k: v for k, v in os.environ.items() if not k.startswith("DUEFLOW_")}
        # A database per tree, migrated by that tree: the trees' schemas may differ.
        envs = {
            name: {**clean, "DUEFLOW_DATABASE_URL": f"sqlite:///{tmp}/status-{name}.db"}
            for name in trees
        }
        if opts.database_url:
            envs = {name: {**clean, "DUEFLOW_DATABASE_URL": opts.database_url} for name in trees}
        for name, src in trees.items():
            if opts.database_url:
                break
            subprocess.run(
                [str(DUEFLOW), "migrate"],
                env={**envs[name], "PYTHONPATH": str(src)},
                check=True,
                stdout=subprocess.DEVNULL,
            )
        for args in (["--help"], ["status"]):
            times: dict[str, list[float]] = {name: [] for name in trees}
            for _ in range(opts.runs):
                for name, src in trees.items():
                    times[name].append(wall(src, args, envs[name]))
            for name, found in times.items():
                print(
                    f"dueflow {' '.join(args)}: {name} median {statistics.median(found) * 1000:.0f}"
                    f" ms (min {min(found) * 1000:.0f}, max {max(found) * 1000:.0f}; "
                    f"{opts.runs} runs)"
                )
        if opts.database_url:
            floors = {"python -c pass": "pass", "status' imports alone": STATUS_IMPORTS}
            for label, code in floors.items():
                took: dict[str, list[float]] = {name: [] for name in trees}
                for _ in range(opts.runs):
                    for name, src in trees.items():
                        took[name].append(python(src, code))
                for name, found in took.items():
                    print(f"{label}: {name} median {statistics.median(found) * 1000:.0f} ms")
        imports: dict[str, list[float]] = {name: [] for name in trees}
        for _ in range(10):
            for name, src in trees.items():
                imports[name].append(import_ms(src))
        for name, found in imports.items():
            print(f"import dueflow.cli: {name} median {statistics.median(found):.0f} ms (10 runs)")
    print(f"load average after: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
