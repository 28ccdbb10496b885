"""`pip install .` gives a working `dueflow serve`: the wheel built from this tree carries the
admin templates, the static files and the migrations, and a fresh venv that has dueflow only from
that wheel serves the API, the admin pages and their static files over a schema it migrated.

The fresh venv has no packages of its own but the wheel (installed with ``--no-deps``); a ``.pth``
file lends it the project venv's site-packages for the dependencies only. (``venv
--system-site-packages`` from a venv's python would lend the base interpreter's site-packages,
where the dependencies are not.) A plain path in a ``.pth`` file does not run that directory's own
``.pth`` files, so the project's editable install of dueflow never reaches the fresh venv.

The docs that go with it are the repository's own: every path README.md and docs/ refer to is in
the repository, and no heading carries an internal issue number."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import eventually_sync
from tests.e2e.live import answers, free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

# What `dueflow serve` reads from its own package at run time, beside the modules.
PACKAGE_DATA = (
    "dueflow/py.typed",
    "dueflow/api/templates/base.html",
    "dueflow/api/templates/login.html",
    "dueflow/api/templates/dashboard.html",
    "dueflow/api/static/admin.css",
    "dueflow/api/static/admin.js",
    "dueflow/store/migrations/env.py",
    "dueflow/store/migrations/script.py.mako",
)


@dataclass
class Installed:
    """A fresh venv with dueflow installed from the wheel alone."""

    wheel: Path
    venv: Path

    @property
    def python(self) -> Path:
        """The fresh venv's interpreter."""
        return self.venv / "bin" / "python"

    @property
    def dueflow(self) -> Path:
        """The console script the wheel installed into the fresh venv."""
        return self.venv / "bin" / "dueflow"


def run(args: list[str | Path], cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run a command to completion; its output, or the test fails showing it."""
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        pytest.fail(f"{args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def clean_env() -> dict[str, str]:
    """This environment without dueflow settings or a Python path that could lend the sources."""
    drop = ("DUEFLOW_", "PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


def build_wheel(out: Path) -> Path:
    """The wheel of this tree, built by the project's own backend without the network."""
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    run([*pip_wheel, "-q", "-w", out, ROOT], cwd=out)
    (wheel,) = out.glob("dueflow-*.whl")
    return wheel


def fresh_venv(venv: Path) -> None:
    """A venv without pip whose only extra path is the project venv's site-packages."""
    run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=venv.parent)
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    site = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    (site / "project_dependencies.pth").write_text("".join(f"{p}\n" for p in sorted(deps)))


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    base = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(base)
    venv = base / "venv"
    fresh_venv(venv)
    pip = [sys.executable, "-m", "pip", "--python", venv / "bin" / "python"]
    run([*pip, "install", "-q", "--no-deps", "--no-index", wheel], cwd=base, env=clean_env())
    return Installed(wheel, venv)


def test_the_wheel_carries_templates_static_files_and_migrations(installed: Installed) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    assert set(PACKAGE_DATA) <= names, sorted(set(PACKAGE_DATA) - names)
    versions = sorted((ROOT / "src/dueflow/store/migrations/versions").glob("[0-9]*.py"))
    assert versions, "no migration scripts in the tree"
    shipped = {f"dueflow/store/migrations/versions/{v.name}" for v in versions}
    assert shipped <= names, sorted(shipped - names)
    assert not any(n.startswith(("tests/", "benchmarks/", "docs/")) for n in names)


def test_the_fresh_venv_imports_dueflow_from_the_wheel_only(installed: Installed) -> None:
    where = run(
        [installed.python, "-c", "import dueflow, fastapi; print(dueflow.__file__)"],
        cwd=installed.venv,
        env=clean_env(),
    ).strip()
    assert Path(where).is_relative_to(installed.venv), where
    assert not Path(where).is_relative_to(ROOT / "src"), where


@pytest.fixture
def served(installed: Installed, tmp_path: Path) -> Iterator[str]:
    """The fresh venv's `dueflow serve` on a new SQLite file and a free port; its base URL."""
    port = free_port()
    env = clean_env() | {
        "DUEFLOW_DATABASE_URL": f"sqlite:///{tmp_path / 'wheel.db'}",
        "DUEFLOW_PROFILE": "dev",
    }
    log_path = tmp_path / "serve.log"
    args = [str(installed.dueflow), "serve", "--port", str(port)]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=log, stderr=log)
    base = f"http://127.0.0.1:{port}"
    try:
        if not eventually_sync(lambda: answers(f"{base}/healthz"), 30, 0.1):
            pytest.fail(f"the wheel's server did not start:\n{log_path.read_text()}")
        yield base
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0, log_path.read_text()


def test_the_wheels_dueflow_serve_answers_probes_pages_and_static_files(served: str) -> None:
    with httpx.Client(base_url=served, timeout=5) as client:
        assert client.get("/healthz").status_code == 200
        ready = client.get("/readyz")  # the schema was migrated from the wheel's scripts
        assert ready.status_code == 200, ready.text
        login = client.get("/admin/login")  # rendered from the wheel's templates
        assert login.status_code == 200
        assert 'name="token"' in login.text
        css = client.get("/admin/static/admin.css")
        assert css.status_code == 200
        assert css.headers["content-type"].startswith("text/css")
        assert css.content == (ROOT / "src/dueflow/api/static/admin.css").read_bytes()


# --- the docs refer only to what is in the repository ---------------------------------------

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)|src=\"([^\"]+)\"")
# A path written in backticks that leaves the directory it is written in (`../shared/...`).
UPWARD = re.compile(r"`(\.\./[^`\s]+)`")
ISSUE_IN_HEADING = re.compile(r"^#+ .*\(issues? \d+", re.IGNORECASE)


def outside_paths(doc: Path, text: str) -> list[str]:
    """The relative paths ``text`` (written in ``doc``) names that are not in the repository."""
    named = [a or b for a, b in LINK.findall(text)] + UPWARD.findall(text)
    local = [n.split("#")[0] for n in named if not re.match(r"[a-z]+:|#", n)]
    return [
        n
        for n in local
        if n
        and (
            not (doc.parent / n).resolve().is_relative_to(ROOT)
            or not (doc.parent / n).resolve().exists()
        )
    ]


def headings(text: str) -> list[str]:
    """The Markdown headings of ``text``, outside fenced code blocks."""
    found, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            found.append(line)
    return found


def test_the_docs_name_only_paths_inside_the_repository() -> None:
    assert (ROOT / "docs/design.md").is_file()
    outside = {d.name: outside_paths(d, d.read_text()) for d in DOCS}
    assert not {name: paths for name, paths in outside.items() if paths}
    # The checks themselves catch what the docs once said.
    assert outside_paths(ROOT / "README.md", "The design: `../shared/DESIGN.md`.") == [
        "../shared/DESIGN.md"
    ]
    assert outside_paths(ROOT / "docs/x.md", "[a](../README.md) [b](gone.md) [c](#x)") == [
        "gone.md"
    ]


def test_no_heading_carries_an_issue_number() -> None:
    numbered = [h for d in DOCS for h in headings(d.read_text()) if ISSUE_IN_HEADING.match(h)]
    assert numbered == []
    assert ISSUE_IN_HEADING.match("## The herd (issue 2): 100,000 unpaid orders")
    assert headings("```sh\n# a comment\n```\n## Real") == ["## Real"]
