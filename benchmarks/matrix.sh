#!/usr/bin/env bash
# The herd on every store and trigger of issue 5, one and two workers (results as JSON lines).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
N=${N:-100000}
PG=postgresql://postgres@127.0.0.1:5432/test
MY=mysql://root@127.0.0.1:3306/test
REDIS=redis://127.0.0.1:6379/13
AMQP=amqp://guest:guest@127.0.0.1:5672/
for workers in 1 2; do
  $PY benchmarks/herd.py --orders "$N" --workers "$workers"
  $PY benchmarks/herd.py --orders "$N" --workers "$workers" --database-url "$PG"
  $PY benchmarks/herd.py --orders "$N" --workers "$workers" --database-url "$PG" --trigger-url "$REDIS?prefix=herd$workers"
  $PY benchmarks/herd.py --orders "$N" --workers "$workers" --database-url "$PG" --trigger-url "$AMQP?prefix=herd$workers"
  $PY benchmarks/herd.py --orders "$N" --workers "$workers" --database-url "$MY" --trigger-url "$REDIS?prefix=herdmy$workers"
done
$PY benchmarks/pg_limit.py --orders "$N" --block 200
$PY benchmarks/pg_limit.py --orders "$N" --block 2000
