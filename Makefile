# The two commands of the README: `make lab` and `make test`. `make serve` runs the demo models headless, `make docs`
# serves the guide (docs/, mkdocs.yml) at http://127.0.0.1:8000 as it is edited.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO   ?= demo-models
# `make serve`'s ports: TF Serving's defaults.
GRPC_PORT ?= 8500
REST_PORT ?= 8501
# Extra arguments for JupyterLab (`make lab LAB_ARGS="--no-browser --port=8900"`).
LAB_ARGS ?=
# JupyterLab refuses to start as root without --allow-root, and root is how containers, cloud notebooks and CI
# machines run it.
LAB_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)
WHEEL_DIR ?= dist
# The PyTorch the tests run on (the test extra pins its version): its CPU build.
TORCH_CPU := 2.13.0+cpu
# The JupyterLab sidebar: TypeScript in extension/, built into the Python package (and shipped in its wheel).
LABEXT      := workbench/labextension/package.json
LABEXT_LINK := $(VENV)/share/jupyter/labextensions/workbench-serving-jupyterlab
EXT_SOURCES := $(wildcard extension/src/*.ts extension/src/*.tsx extension/style/*) \
               extension/package.json extension/package-lock.json extension/tsconfig.json
# extension/node_modules as extension/package-lock.json says, installed by `npm ci` (which never writes the lock file,
# and refuses one that package.json has outgrown) when either file changes; the stamp lives inside node_modules,
# which `npm ci` empties first.
NODE_STAMP  := extension/node_modules/.installed-from-lock
# `make test` runs the suite on this many pytest-xdist workers, each test file on one (tests/conftest.py keeps the
# files that share the checkout's build, or Ray's /tmp/ray, on one worker): one a core and one more, which runs
# while the others' tests wait (on a download, a browser, a model's sleep); on 2 cores 3 workers took 17% less time
# than 2. `make test TEST_WORKERS=0` runs it in one process; PYTEST_ARGS is passed on (`PYTEST_ARGS="-x tests/wire"`).
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
PYTEST_ARGS  ?=

# $(call venv_install,ARGS): `pip install ARGS` into the venv, by uv where it is there. uv reads no pip.conf: pip's
# find-links (where a machine keeps wheels of its own, such as PyTorch's CPU build; whitespace-separated, where uv
# separates them with commas) are passed on. Modules are compiled to bytecode at install, as pip does: uncompiled,
# every process of the first run (the test workers, a Ray cluster's dozen, starting at once) compiles what it imports.
venv_install = if [ -x $(BIN)/uv ]; then \
	  links="$${PIP_FIND_LINKS:-$$($(BIN)/python -m pip config get global.find-links 2>/dev/null)}"; \
	  UV_FIND_LINKS="$${UV_FIND_LINKS:-$$(echo $$links | tr ' ' ',')}" \
	    $(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python $(1); \
	else $(BIN)/python -m pip install --quiet $(1); fi

.PHONY: install lab serve docs test test-busy test-granian test-fast test-extension wheel lint clean

install: $(STAMP) $(LABEXT)

# Reinstall whenever the project's dependencies (or the way they are installed) change. The editable install builds the extension too (npm, via
# hatch-jupyter-builder, on the node_modules `npm ci` installed); `develop` then links it into the venv's JupyterLab
# so that a rebuild shows at reload.
$(STAMP): pyproject.toml extension/package.json extension/package-lock.json Makefile | $(NODE_STAMP)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@# uv installs the same pins as pip in a third of the time (the dev environment, compiled: 75 s against 3.9 min
	@# on 2 cores); where it cannot be installed, pip does it all.
	$(BIN)/python -m pip install --quiet uv || echo "uv not installed: installing with pip"
	@# `develop` below links the built extension into the venv; a reinstall would copy the wheel's shared data
	@# through that link into workbench/labextension (install.json there breaks the next wheel build).
	test ! -L $(LABEXT_LINK) || rm $(LABEXT_LINK)
	@# PyTorch's CPU build first (the tests' torch, pinned in the test extra): PyPI's Linux wheel carries 4 GB of CUDA
	@# libraries, and pip would take it. This project's machines keep the CPU build on disk; elsewhere PyTorch's own
	@# CPU index serves it. The install below keeps the torch it finds.
	$(call venv_install,"torch==$(TORCH_CPU)") \
	  || $(call venv_install,--index-url https://download.pytorch.org/whl/cpu "torch==$(TORCH_CPU)")
	$(call venv_install,-e '.[dev]')
	$(BIN)/jupyter-builder develop --overwrite workbench
	touch $(STAMP)

$(NODE_STAMP): extension/package.json extension/package-lock.json
	cd extension && npm ci --no-audit --no-fund --loglevel=error
	touch $(NODE_STAMP)

# Rebuild the extension when its sources change.
$(LABEXT): $(EXT_SOURCES) $(NODE_STAMP) | $(STAMP)
	cd extension && PATH="$(abspath $(BIN)):$$PATH" npm run build
	touch $(LABEXT)

lab: install
	$(BIN)/jupyter lab $(LAB_ROOT) $(LAB_ARGS) notebooks/

$(DEMO)/models.config: | install
	$(BIN)/workbench demo $(DEMO)

serve: install $(DEMO)/models.config
	$(BIN)/workbench serve --port=$(GRPC_PORT) --rest_api_port=$(REST_PORT) --model_config_file=$(DEMO)/models.config

# The guide, rebuilt at each change (DOCS_ARGS: `make docs DOCS_ARGS="--dev-addr=0.0.0.0:8000"`). `make test` builds it
# with --strict (tests/system/test_guide_build.py).
DOCS_ARGS ?=
docs: install
	$(BIN)/mkdocs serve $(DOCS_ARGS)

# The wheel users install: the extension in its production build inside (no Node.js needed to install it).
# Built without isolation, with the build backends the dev extras installed; the hook sees the fresh build
# and does not run npm again.
wheel: install
	cd extension && PATH="$(abspath $(BIN)):$$PATH" npm run build:prod
	$(BIN)/python -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir $(WHEEL_DIR) .

test: install test-extension
	$(BIN)/python -m pytest $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile) --durations=20 $(PYTEST_ARGS)

# The same on a busy machine: the run starts one CPU-burning process a core at normal priority (tests/conftest.py's
# --busy), as a shared CI machine's other work, and stops them at its end. Every test passes so too.
test-busy: install test-extension
	$(BIN)/python -m pytest $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile) --busy $(PYTEST_ARGS)

# The REST suites (every test of TF Serving's, v2's and TorchServe's REST APIs, TLS, drains) with every server on
# granian (--http_server=granian, through tests/conftest.py's --http-server) instead of uvicorn.
GRANIAN_SUITES = tests/wire/test_rest_predict.py tests/wire/test_classify_regress.py tests/wire/test_v2_rest.py \
	tests/wire/test_torchserve.py tests/wire/test_tls.py tests/wire/test_drain.py tests/wire/test_drain_connections.py \
	tests/wire/test_hot_routes.py
test-granian: install
	$(BIN)/python -m pytest $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile) --http-server=granian \
		$(GRANIAN_SUITES) $(PYTEST_ARGS)

# The unit tier alone (tests/unit: in-process, on fakes, no framework, no sockets): seconds, for the edit loop.
test-fast: install
	$(BIN)/python -m pytest tests/unit

# The sidebar's model → view logic, with jest.
test-extension: install
	cd extension && npm test --silent

lint: install
	$(BIN)/ruff check workbench tests benchmarks
	$(BIN)/mypy workbench
	cd extension && npx tsc --noEmit -p tsconfig.test.json

clean:
	rm -rf $(VENV) $(DEMO) $(WHEEL_DIR) site .pytest_cache workbench/labextension extension/node_modules extension/lib extension/tsconfig.tsbuildinfo
