# The two commands of the README: `make demo` (the daemon on a simulated inf1.6xlarge,
# a model loaded and inferred) and `make test` (the whole suite). Both install first.
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test lint bench proto
setup: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml scripts/bootstrap.sh
	bash scripts/bootstrap.sh

demo: setup
	$(VENV)/bin/neuron-rtd-demo

test: setup
	$(PY) -m pytest -q

lint: setup
	$(VENV)/bin/ruff check . && $(VENV)/bin/mypy && $(VENV)/bin/lint-imports \
		&& $(PY) -m neuron_rtd.protogen --check

bench: setup
	$(PY) bench/infer_roundtrip.py

proto: setup
	$(PY) -m neuron_rtd.protogen
