# cs-run developer entry points. `make run` and `make test` work on a fresh machine.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# torch's OpenMP threads spin and fight on a 2-core shared host; tests and runs pin them.
export OMP_NUM_THREADS ?= 1

.PHONY: setup run test bench lint clean

setup: $(STAMP)

# torch is installed explicitly first: a loose requirement on a bare machine would fetch a CUDA build.
$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,examples,dev]'
	touch $(STAMP)

run: setup
	$(VENV)/bin/cs-run train-and-eval --params examples/fc_mnist/params.yaml --model_dir model_dir/fc_mnist

test: setup
	$(PY) -m pytest -q

bench: setup
	@for b in bench/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

lint: setup
	$(VENV)/bin/ruff check cs_run runners optim checkpoint examples tests bench

clean:
	rm -rf $(VENV) model_dir build *.egg-info
