"""`dueflow serve` runs on uvloop and parses HTTP with httptools (issue 12, item 1): the server says
so at start-up from the loop it really runs, and the process has both libraries loaded."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.live import serve


def test_serve_runs_on_uvloop_and_httptools(tmp_path):
    with serve(tmp_path, dev_users=False) as served:
        assert "(worker on, uvloop, httptools)" in served.output()
        maps = Path(f"/proc/{served.proc.pid}/maps").read_text()
        assert "/uvloop/loop." in maps
        assert "/httptools/parser/" in maps
        assert served.stop() == 0
