# One command to run, one to test; each creates the virtualenv and installs what it needs.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
EXTRAS ?= test,rabbitmq,kafka
comma  := ,
STAMP  := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

.PHONY: run test lint typecheck bench system-deps clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[$(EXTRAS)]'
	touch $@

venv: $(STAMP)

## run: start the broker on the embedded adapter at http://127.0.0.1:8080/wsn/broker
run: $(STAMP)
	$(BIN)/wsnmom serve $(ARGS)

system-deps:
	bash scripts/system-deps.sh

## test: lint, type-check and run the whole test suite (starts local brokers itself)
test: $(STAMP) system-deps lint typecheck
	$(BIN)/pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	MYPY=$(BIN)/mypy bash scripts/typecheck.sh

## bench: benchmarks against the embedded adapter and local brokers (bench/results/latest.json)
bench: system-deps
	$(MAKE) --no-print-directory EXTRAS=test,rabbitmq,kafka,bench venv
	$(BIN)/python -m bench $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
