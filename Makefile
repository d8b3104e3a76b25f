# Two commands for a fresh machine: `make demo` and `make test`. `make docs` builds the docs site.
PYTHON ?= $(shell for p in python3 python3.13 python3.12 python3.11 python3.10; do $$p -c 'import sys; sys.exit(sys.version_info < (3, 10))' >/dev/null 2>&1 && { echo $$p; break; }; done)
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# -qq: errors only. pip's warnings here are about the machine's own index settings and
# setuptools' notice about editable installs, neither of which a user can act on.
PIP    := $(BIN)/python -m pip install -qq

.PHONY: demo test lint format models install schema clean bench nightly docs

demo: models
	$(BIN)/trtbuild build --policy policies/nafnet.yaml

test: install models
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m mypy tests/static/api_usage.py
	$(BIN)/python -m pytest

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -n "$(PYTHON)" || { echo "trtbuild needs Python >= 3.10 on PATH (or PYTHON=/path/to/python3.x)"; exit 2; }
	@echo "installing trtbuild and its dependencies into $(VENV)"
	@$(PYTHON) -m venv $(VENV)
	@$(PIP) --upgrade pip
	@$(PIP) -e ".[rtx,dev,docs]"
	@# pip compiles a regular install's bytecode, not an editable one's; where the environment
	@# sets PYTHONDONTWRITEBYTECODE (many container images do), every run would compile
	@# trtbuild's modules again. Stale files are recompiled in memory: this is only speed.
	@$(BIN)/python -m compileall -q trtbuild
	@touch $(STAMP)

models: install
	$(BIN)/python scripts/make_models.py --out models
	$(BIN)/python scripts/make_quantized.py --out models
	$(BIN)/python scripts/fetch_models.py --out models
	$(BIN)/python scripts/make_audio.py --out models
	$(BIN)/python scripts/make_text_images.py --out models

nightly: install models
	$(BIN)/trtbuild nightly --policies policies --out build/nightly --history history/nightly.sqlite

bench: install models
	@$(PIP) -e ".[bench]"
	$(BIN)/python scripts/fetch_models.py photo_text --out models
	$(BIN)/python benchmarks/bench_convert.py
	$(BIN)/python benchmarks/bench_tune.py $(if $(MODELOPT_PYTHON),--modelopt-python $(MODELOPT_PYTHON))
	$(BIN)/python benchmarks/bench_memory.py $(if $(MODELOPT_PYTHON),--modelopt-python $(MODELOPT_PYTHON))

# The docs site (docs/ -> build/docs/), strict: a warning, a broken link or a missing
# cross-reference fails (-W --keep-going -n); -E reads every page each time, so a warning
# is never hidden by an earlier build. Sphinx and its extensions are the `docs` extra, which
# `make install` installs (tests/test_docs.py builds the CLI and API pages with it too).
docs: install
	$(BIN)/sphinx-build -E -W --keep-going -n -q -b html docs build/docs
	@echo "wrote build/docs/index.html"

schema: install
	$(BIN)/trtbuild schema > docs/policy.schema.json

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:
	rm -rf build .cache .pytest_cache .ruff_cache .mypy_cache
