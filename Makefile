# make demo / make test create .venv when missing, install, then run.
# .venv is today's stack: the newest transformers 5.x, huggingface-hub, tokenizers and sentence-transformers
# (eager upgrades), torch from constraints.txt. .venv-compat (make test-compat) is transformers 4.57 with
# optimum-onnx, which cannot install beside transformers 5.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
COMPAT := .venv-compat
COMPAT_BIN := $(COMPAT)/bin
COMPAT_STAMP := $(COMPAT)/.installed
PYTEST_ARGS ?=
# Workers of the default test run (pytest-xdist; 0: serial, in this process).
TEST_WORKERS ?= 2

.PHONY: venv venv-compat demo test test-compat test-slow test-all lint docs bench bench-all clean

venv: $(STAMP)

venv-compat: $(COMPAT_STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q --upgrade --upgrade-strategy eager -c constraints.txt -e '.[all]'
	# torchvision has no build for this CPU torch; something may pull it in and it breaks transformers' imports.
	-$(BIN)/python -m pip uninstall -q -y torchvision
	# The report's browser tests need Chromium (Debian's package; root on a fresh CI machine). Without it they skip.
	command -v chromium >/dev/null && command -v chromedriver >/dev/null || (apt-get update -q && apt-get install -y -q chromium chromium-driver) \
		|| echo "Chromium could not be installed: the report's browser tests will be skipped"
	touch $(STAMP)

$(COMPAT_STAMP): pyproject.toml constraints.txt constraints-compat.txt
	test -x $(COMPAT_BIN)/python || $(PYTHON) -m venv $(COMPAT)
	$(COMPAT_BIN)/python -m pip install -q --upgrade pip
	$(COMPAT_BIN)/python -m pip install -q -c constraints-compat.txt -e '.[train,sentence,optimum,optimize,dev]'
	-$(COMPAT_BIN)/python -m pip uninstall -q -y torchvision
	touch $(COMPAT_STAMP)

demo: venv
	$(BIN)/modelexport pipeline --overwrite

# The default run (not slow) stays under 10 minutes on 2 cores; --durations keeps its slowest tests in view.
# Two workers: each rebuilds the session fixtures (MiniLM export, trained digits CNN), about 90 s more CPU in all,
# but on a fresh clone with 2 cores serial `make test` took 10:48 (pytest 554 s of it), two workers 5:46 of pytest.
# TEST_WORKERS=0 runs serially (a busy machine, a debugger).
# Tests marked `optimum` need optimum-onnx (transformers 4.57): make test-compat runs them.
test: venv
	$(BIN)/python -m pytest --durations=15 -m 'not slow and not optimum' -n $(TEST_WORKERS) $(PYTEST_ARGS)

# Under transformers 4.57 + optimum-onnx: every test that involves Optimum (slow ones included), the main
# flows' smoke set (`compat`), and packages exported under one major version run under the other
# (MODELEXPORT_OTHER_PYTHON: the main environment's interpreter). Under 5 minutes on 2 cores.
test-compat: venv venv-compat
	MODELEXPORT_OTHER_PYTHON=$(abspath $(BIN)/python) $(COMPAT_BIN)/python -m pytest --durations=10 \
		-m 'optimum or compat' $(PYTEST_ARGS)

test-slow: venv
	$(BIN)/python -m pytest -m 'slow and not optimum' $(PYTEST_ARGS)

test-all: venv
	$(BIN)/python -m pytest -m 'not optimum' $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

# The documentation site (docs/, mkdocs.yml) into site/; strict: a warning (a broken link, a docstring the API
# reference cannot read) fails the build. Its examples are run by the test suite (tests/docs/).
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

bench: venv
	$(BIN)/python benchmarks/export_overhead.py

# Every ratio benchmark (tens of minutes on 2 cores); each writes benchmarks/results/<name>.json. Those
# whose peer is Optimum (pipeline_latency, fusion_latency, generation, infer_cold_start) run in .venv-compat.
bench-all: venv venv-compat
	$(BIN)/python benchmarks/export_overhead.py
	$(BIN)/python benchmarks/analyze_speed.py
	$(COMPAT_BIN)/python benchmarks/pipeline_latency.py
	$(BIN)/python benchmarks/quantization.py
	$(BIN)/python benchmarks/test_time.py

clean:
	rm -rf $(VENV) $(COMPAT) build dist site *.egg-info .pytest_cache
