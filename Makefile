# One command to run, one to test; each creates the virtualenv and installs what it needs.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
comma  := ,
# what `make run` installs: the gateway and the client libraries of its adapters
RUN_EXTRAS  ?= rabbitmq,kafka,mqtt,postgres
# what `make test` / `lint` / `typecheck` install: the above plus the test and lint tools
TEST_EXTRAS ?= test,rabbitmq,kafka,mqtt,postgres,spark
# `make venv EXTRAS=...` installs any set of extras
EXTRAS ?= $(TEST_EXTRAS)
# one stamp per set of extras: .venv/.installed-test-rabbitmq
stamp = $(VENV)/.installed-$(subst $(comma),-,$(1))

.PHONY: run test lint typecheck bench mutation system-deps clean venv

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed-%: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[$(subst -,$(comma),$*)]'
	touch $@

venv: $(call stamp,$(EXTRAS))

## run: start the broker on the embedded adapter at http://127.0.0.1:8080/wsn/broker
run: $(call stamp,$(RUN_EXTRAS))
	$(BIN)/wsnmom serve $(ARGS)

system-deps:
	bash scripts/system-deps.sh

# the suite on pytest-xdist workers, each with its own session brokers and gateways, a test
# module's tests on one worker (its module-scoped gateway or browser starts once):
# docs/testing.md, "Where the time goes"
TEST_WORKERS ?= 3
PYTEST_ARGS  ?= -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25

## test: lint, type-check and run the whole test suite (starts local brokers itself)
test: $(call stamp,$(TEST_EXTRAS)) system-deps lint typecheck
	$(BIN)/pytest $(PYTEST_ARGS)

lint: $(call stamp,$(TEST_EXTRAS))
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(call stamp,$(TEST_EXTRAS))
	MYPY=$(BIN)/mypy bash scripts/typecheck.sh

## bench: benchmarks against the embedded adapter and local brokers (bench/results/latest.json)
bench: system-deps
	$(MAKE) --no-print-directory EXTRAS=test,rabbitmq,kafka,mqtt,postgres,spark,bench venv
	$(BIN)/python -m bench $(ARGS)

## mutation: mutation-test the delivery modules (minutes per module; not part of `make test`)
## (`make mutation ARGS="channel cursor"` runs only those; the report: docs/testing.md)
mutation: $(call stamp,$(TEST_EXTRAS))
	BIN=$(BIN) bash scripts/mutation.sh $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache .mutmut-cache
