# The two commands of the README: `make demo` (the daemon on a simulated inf1.6xlarge,
# a model loaded and inferred) and `make test` (the whole suite). Both install first.
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test lint bench proto fuzz deb perf-analyzer
setup: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml scripts/bootstrap.sh
	bash scripts/bootstrap.sh

demo: setup
	$(VENV)/bin/neuron-rtd-demo

# Two workers (pytest-xdist), each taking whole test files: most tests wait on a daemon,
# a subprocess or a socket more than they compute, and two workers overlap the waits
# (the suite 12.3 -> 8.4 min on the 2-core machine, measured).
test: setup
	$(PY) -m pytest -q -n 2 --dist loadfile

# scripts/house_rules.py: the project's own rules (module length, one class per name, the
# import contracts covering every module, cited files existing).
lint: setup
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && $(VENV)/bin/mypy \
		&& $(VENV)/bin/lint-imports \
		&& $(PY) -m neuron_rtd.protogen --check \
		&& $(PY) scripts/house_rules.py

# Each fuzz harness for FUZZ_SECONDS (default 60), growing its working corpus in
# fuzz/.work/NAME from the seeds in fuzz/corpus/NAME; what it finds goes to fuzz/.work.
FUZZ_SECONDS ?= 60
fuzz: setup
	@for h in neff_reader wire_requests example_records; do \
		mkdir -p fuzz/.work/$$h && echo "fuzz: $$h for $(FUZZ_SECONDS) s"; \
		$(PY) fuzz/$$h.py fuzz/.work/$$h fuzz/corpus/$$h -max_total_time=$(FUZZ_SECONDS) \
			-timeout=30 -rss_limit_mb=3072 -artifact_prefix=fuzz/.work/$$h- \
			-print_final_stats=1 > fuzz/.work/$$h.log 2>&1; rc=$$?; \
		grep -E "^(Done|stat::(number|average|peak))" fuzz/.work/$$h.log; \
		[ $$rc -eq 0 ] || { tail -40 fuzz/.work/$$h.log; exit 1; }; \
	done

bench: setup
	$(PY) bench/infer_roundtrip.py

proto: setup
	$(PY) -m neuron_rtd.protogen

# The Debian package (dpkg-deb): dist/neuron-rtd_VERSION_ARCH.deb; check it with lintian.
deb: setup
	$(PY) packaging/build_deb.py --out dist

# Triton's perf_analyzer (docs/kserve.md) as .venv/bin/perf_analyzer: tritonclient
# 2.51.0's build, the last that runs on Debian 12, with its libraries (pip download).
perf-analyzer: setup
	$(PY) scripts/perf_analyzer.py
