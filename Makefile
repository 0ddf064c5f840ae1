# The two commands of the README: `make lab` and `make test`. `make serve` runs the demo models headless.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO   := demo-models

.PHONY: install lab serve test bench lint clean

install: $(STAMP)

# Reinstall whenever the project's dependencies change.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

lab: install
	$(BIN)/jupyter lab notebooks/

$(DEMO)/models.config: | install
	$(BIN)/workbench demo $(DEMO)

serve: install $(DEMO)/models.config
	$(BIN)/workbench serve --port=8500 --rest_api_port=8501 --model_config_file=$(DEMO)/models.config

test: install
	$(BIN)/python -m pytest

lint: install
	$(BIN)/ruff check workbench tests
	$(BIN)/mypy workbench

clean:
	rm -rf $(VENV) $(DEMO) .pytest_cache
