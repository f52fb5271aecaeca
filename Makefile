# Set-up is automatic: `make test` and `make demo` create .venv and install everything on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TRITON_VERSION ?= 3.6.0

.PHONY: test demo demo-results demo-dispersion lint bench-cpu clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev,hf,lm]' triton==$(TRITON_VERSION)
	touch $(STAMP)

test: $(STAMP)
	TRITON_INTERPRET=1 $(PY) -m pytest -q -m "not gpu" tests

demo: $(STAMP)
	$(PY) -m asentmax demo

# the same run, then copied to the committed results/demo/ and written into README.md's demo table
demo-results: $(STAMP)
	$(PY) -m asentmax demo --publish

demo-dispersion: $(STAMP)
	$(PY) -m asentmax.dispersion

lint: $(STAMP)
	$(PY) -m ruff check src tests benchmarks

bench-cpu: $(STAMP)
	$(PY) benchmarks/bench_entmax_cpu.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info
