# The two commands of the README. Each makes its own virtual environment in .venv.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

.PHONY: demo test bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test,demo]'
	touch $@

demo: $(VENV)/.installed
	$(PY) examples/digits/train.py

test: $(VENV)/.installed
	$(PY) -m pytest -q

bench: $(VENV)/.installed
	$(PY) benchmarks/step.py

clean:
	rm -rf $(VENV)
