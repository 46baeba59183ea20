# verde_chain — two commands for a newcomer: `make demo` and `make test`.
# Both install what they need (Python venv from pyproject.toml, npm packages from the lockfile).

VENV    := .venv
PY      := $(VENV)/bin/python
PYSTAMP := $(VENV)/.installed
NPMSTAMP:= node_modules/.installed
TOOLPATH:= $(CURDIR)/build/toolchain
export PATH := $(CURDIR)/node_modules/@foundry-rs/anvil-linux-amd64/bin:$(CURDIR)/$(VENV)/bin:$(PATH)
export SOLCX_BINARY_PATH := $(TOOLPATH)/solcx
# The explorer's browser tests drive Debian's chromium through Playwright (Playwright's own
# browser download cannot work on machines without internet); installed as root, or via sudo.
CHROMIUM:= /usr/bin/chromium
SUDO    := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup browser lint test test-fast demo bench ape-compile ape-test clean

setup: $(PYSTAMP) $(NPMSTAMP) $(SOLCX_BINARY_PATH)/solc-v0.8.28

$(PYSTAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	$(PY) -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['hf'])" \
	  | xargs $(PY) -m pip install --quiet --disable-pip-version-check --no-deps
	touch $@

$(NPMSTAMP): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

# py-solc-x / ape-solidity look for `solc-v<version>` in SOLCX_BINARY_PATH: point it at our shim.
$(SOLCX_BINARY_PATH)/solc-v0.8.28: bin/solc
	mkdir -p $(SOLCX_BINARY_PATH)
	ln -sf $(CURDIR)/bin/solc $@

# ruff (style, imports, bugbear-like checks) and mypy (types) as configured in pyproject.toml.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy verde_chain

# Skipped once the browser is there (a file target): idempotent.
browser: $(CHROMIUM)

$(CHROMIUM):
	$(SUDO) apt-get update
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y chromium

# Tests marked `realtime` spend minutes waiting on real 12 s blocks with the CPU idle: they run
# in a second pytest process beside the rest, and `make test` fails if either run fails. (Two
# processes draw ports side by side: an Anvil proves the node answering is its own, ports.py.)
test: setup lint $(CHROMIUM)
	@mkdir -p build; \
	$(PY) -m pytest -m realtime > build/realtime-tests.log 2>&1 & realtime=$$!; \
	$(PY) -m pytest -m "not realtime"; rest=$$?; \
	wait $$realtime; rt=$$?; \
	echo "--- tests marked realtime (run beside the rest; log in build/realtime-tests.log):"; \
	cat build/realtime-tests.log; \
	test $$rest -eq 0 -a $$rt -eq 0

test-fast: setup
	$(PY) -m pytest -m "not chain and not slow"

demo: setup
	$(VENV)/bin/verde-chain demo

bench: setup
	$(PY) scripts/bench_merkle.py

# TMPDIR inside build/: ape isolates its compile in a temp copy unless the project already lies
# under the temp dir (e.g. a clone in /tmp), where it would unpack dependencies in place.
ape-compile: setup
	mkdir -p build/ape-tmp && TMPDIR=$(CURDIR)/build/ape-tmp $(VENV)/bin/ape compile --force

ape-test: setup
	mkdir -p build/ape-tmp && TMPDIR=$(CURDIR)/build/ape-tmp $(VENV)/bin/ape test tests/ape

clean:
	rm -rf build .pytest_cache
