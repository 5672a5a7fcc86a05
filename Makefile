# The two commands of the README: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: run example test lint bench clean

$(VENV)/.installed-run: pyproject.toml deploy/install-system-deps.sh
	./deploy/install-system-deps.sh run
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed-run
	./deploy/install-system-deps.sh test
	$(PIP) install -q -e '.[test]'
	# Real PyTorch (CPU build) for tests that produce real tracebacks and torchrun output.
	$(PIP) install -q torch==2.13.0 || echo "triage: torch not installable here; live torch tests will skip" >&2
	touch $@

run: $(VENV)/.installed-run
	mkdir -p logs
	@echo "triage: watching ./logs/**/*.log and the kernel log; try: curl localhost:8750/incidents (Ctrl-C stops)"
	$(VENV)/bin/triage serve --listen 127.0.0.1:8750 --state-dir .state --watch './logs/**/*.log'

example: $(VENV)/.installed-run
	$(VENV)/bin/triage scan --kernel tests/data/example/kern.log --log tests/data/example/train.log

lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check triage tests benchmarks
	$(VENV)/bin/ruff format --check triage tests benchmarks
	$(VENV)/bin/mypy triage/

test: $(VENV)/.installed-test lint
	$(VENV)/bin/triage patterns check
	$(PY) -m pytest -q

bench: $(VENV)/.installed-run
	$(PY) benchmarks/scan.py
	$(PY) benchmarks/live.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
