"""The real ``dueflow serve`` refuses a misspelled ``DUEFLOW_*`` variable before it starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

DUEFLOW = Path(sys.executable).parent / "dueflow"


def test_serve_with_a_misspelled_variable_exits_2_naming_the_setting(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("DUEFLOW_")}
    env["DUEFLOW_DATABASE_URL"] = f"sqlite:///{tmp_path / 'serve.db'}"
    env["DUEFLOW_PAY_REMINDER"] = "5m"
    result = subprocess.run(
        [str(DUEFLOW), "serve", "--port", "1"],  # never bound: it stops before listening
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert (
        "unknown setting DUEFLOW_PAY_REMINDER; did you mean DUEFLOW_REMINDER_AFTER?"
        in result.stderr
    )
    assert not (tmp_path / "serve.db").exists()
