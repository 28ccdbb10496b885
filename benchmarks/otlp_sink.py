"""A collector that takes OTLP/HTTP trace exports and keeps nothing: what tracing costs the
process that sends, with its spans really encoded and posted (docs/benchmarks.md, tracing).

    .venv/bin/python benchmarks/otlp_sink.py --port 4318 &
    OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 .venv/bin/python benchmarks/http_place.py

Each export is answered 200 with an empty body (an ExportTraceServiceResponse with nothing
rejected); on SIGTERM it prints how many exports and bytes it took.
"""

from __future__ import annotations

import argparse
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType


class Sink(BaseHTTPRequestHandler):
    """Reads each POST whole and answers 200."""

    exports = 0
    received = 0

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        Sink.exports += 1
        Sink.received += len(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=4318)
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Sink)

    def stop(_signal: int, _frame: FrameType | None) -> None:
        print(f"{Sink.exports} exports, {Sink.received} bytes", file=sys.stderr)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    server.serve_forever()


if __name__ == "__main__":
    main()
