# The two commands of the README: `make lab` and `make test`. `make serve` runs the demo models headless.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO   := demo-models
# The JupyterLab sidebar: TypeScript in extension/, built into the Python package (and shipped in its wheel).
LABEXT      := workbench/labextension/package.json
EXT_SOURCES := $(wildcard extension/src/*.ts extension/src/*.tsx extension/style/*) \
               extension/package.json extension/package-lock.json extension/tsconfig.json

.PHONY: install lab serve test test-extension bench lint clean

install: $(STAMP) $(LABEXT)

# Reinstall whenever the project's dependencies change. The editable install builds the extension too (npm, via
# hatch-jupyter-builder); `develop` then links it into the venv's JupyterLab so that a rebuild shows at reload.
$(STAMP): pyproject.toml extension/package.json extension/package-lock.json
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/jupyter-builder develop --overwrite workbench
	touch $(STAMP)

# Rebuild the extension when its sources change; `npm install` is quick when node_modules is up to date.
$(LABEXT): $(EXT_SOURCES) | $(STAMP)
	cd extension && PATH="$(abspath $(BIN)):$$PATH" npm install --no-audit --no-fund --loglevel=error
	cd extension && PATH="$(abspath $(BIN)):$$PATH" npm run build
	touch $(LABEXT)

lab: install
	$(BIN)/jupyter lab notebooks/

$(DEMO)/models.config: | install
	$(BIN)/workbench demo $(DEMO)

serve: install $(DEMO)/models.config
	$(BIN)/workbench serve --port=8500 --rest_api_port=8501 --model_config_file=$(DEMO)/models.config

test: install test-extension
	$(BIN)/python -m pytest

# The sidebar's model → view logic, with jest.
test-extension: install
	cd extension && npm test --silent

lint: install
	$(BIN)/ruff check workbench tests
	$(BIN)/mypy workbench
	cd extension && npx tsc --noEmit -p tsconfig.test.json

clean:
	rm -rf $(VENV) $(DEMO) .pytest_cache workbench/labextension extension/node_modules extension/lib extension/tsconfig.tsbuildinfo
