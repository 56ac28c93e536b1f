# make demo / make test create .venv when missing, install, then run.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: venv demo test test-slow test-all lint bench bench-all clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[all]'
	# torchvision has no build for this CPU torch; something may pull it in and it breaks transformers' imports.
	-$(BIN)/python -m pip uninstall -q -y torchvision
	# The report's browser tests need Chromium (Debian's package; root on a fresh CI machine). Without it they skip.
	command -v chromium >/dev/null && command -v chromedriver >/dev/null || (apt-get update -q && apt-get install -y -q chromium chromium-driver) \
		|| echo "Chromium could not be installed: the report's browser tests will be skipped"
	touch $(STAMP)

demo: venv
	$(BIN)/modelexport pipeline --overwrite

# The default run (not slow) stays under 10 minutes on 2 cores; --durations keeps its slowest tests in view.
# Serial on purpose: with xdist (PYTEST_ARGS='-n 2', supported) each worker rebuilds the session fixtures
# (MiniLM export, trained digits CNN), which cost more CPU than the split saves on a busy 2-core machine.
test: venv
	$(BIN)/python -m pytest --durations=15 $(PYTEST_ARGS)

test-slow: venv
	$(BIN)/python -m pytest -m slow $(PYTEST_ARGS)

test-all: venv
	$(BIN)/python -m pytest -m '' $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

bench: venv
	$(BIN)/python benchmarks/export_overhead.py

# Every ratio benchmark (tens of minutes on 2 cores); each writes benchmarks/results/<name>.json.
bench-all: venv
	$(BIN)/python benchmarks/export_overhead.py
	$(BIN)/python benchmarks/analyze_speed.py
	$(BIN)/python benchmarks/pipeline_latency.py
	$(BIN)/python benchmarks/quantization.py
	$(BIN)/python benchmarks/test_time.py

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache
