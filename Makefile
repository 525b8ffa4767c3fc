# The two commands a fresh machine needs: `make demo` and `make test`.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: test test-pure demo bench install clean controlplane

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "needs $(PYTHON) on PATH"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

## Run the whole test suite: lint, format, layer contracts and types first (fast fail), then
## pytest (unit, conformance, contract, bus, scenario, end to end). ruff checks the whole tree
## (tests and services/embedded too); mypy checks shared, services and the test packages listed in pyproject.toml. The
## Kubernetes-facing tests run on the emulator and on a real control plane; pytest builds that
## (the `controlplane` target's work, cached) in the background while the other tests run, and
## stops at once with a hint if Go is missing.
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest $(PYTEST_ARGS)

## The sub-minute loop while editing: ruff, then the pure tests only (marker `pure`: tests/unit
## without servers; no API server, nats-server or simulator starts, no control-plane build).
test-pure: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -m pure -q $(PYTEST_ARGS)

## Run the embedded default: everything local, a demo workload scaling runners up and down.
demo: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/runnerscale demo $(DEMO_ARGS)

## Run the benchmarks and print their tables.
bench: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m tests.bench $(BENCH_ARGS)

## Build etcd, kube-apiserver and kube-controller-manager from the Go module proxy (cached by
## version outside the checkout); `python -m tests.controlplane up|env|status|down` runs them.
controlplane: $(STAMP)
	$(BIN)/python -m tests.controlplane build

clean:
	rm -rf $(VENV) .pytest_cache
