# dueflow: `make run` serves the whole system on SQLite, `make test` runs the suite.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run demo test lint fmt bench bench-matrix soak clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

# The whole system on SQLite: API, admin pages, worker, scanner, the payment simulator at /sim;
# prints the URL, an admin login and two users' tokens.
run: $(STAMP)
	DUEFLOW_PROFILE=$${DUEFLOW_PROFILE:-dev} $(BIN)/dueflow serve --dev-users

demo: $(STAMP)
	$(BIN)/dueflow demo

# Two processes for most of the suite (each has its own databases: tests/databases.py), then the
# tests that load the whole machine or count on its timing, one at a time.
test: $(STAMP)
	$(BIN)/pytest -q -n 2 -m "not serial"
	$(BIN)/pytest -q -m serial

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples
	$(BIN)/mypy

fmt: $(STAMP)
	$(BIN)/ruff format src tests benchmarks examples
	$(BIN)/ruff check --fix src tests benchmarks examples

bench: $(STAMP)
	$(BIN)/python benchmarks/herd.py
	$(BIN)/python benchmarks/empty_scan.py

bench-matrix: $(STAMP)
	benchmarks/matrix.sh
	$(BIN)/python benchmarks/redis_memory.py

# The chaos soak (about 35 minutes: the machine measured, then four legs; PostgreSQL and RabbitMQ on this machine, and a redis-server of
# its own that it FLUSHALLs): the fleet under load and faults, the invariants checked,
# docs/reliability.md written.
soak: $(STAMP)
	$(BIN)/python -m tests.soak --report docs/reliability.md

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache dueflow.db*
