# The two commands of the README. Each makes its own virtual environment in .venv.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
# Where torch comes from: pip's own index by default (on our machines it holds the CPU build); on a
# machine where that gives the multi-GB CUDA build, `make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu`.
TORCH_INDEX ?=

.PHONY: demo test test-fast bench clean chromium gpu-check strict

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PY) -m pip install --quiet -e '.[test,demo]'
	@# bytecode now, as pip does for a wheel: every worker process imports the package, and where
	@# PYTHONDONTWRITEBYTECODE is set (our machines) it would compile it again at every start
	$(PY) -m compileall -q shapescript
	touch $@

demo: $(VENV)/.installed
	$(PY) examples/digits/train.py

# The tests also run programs' workers on a simulated Ray cluster (tests/cluster): the `ray` extra.
$(VENV)/.ray: $(VENV)/.installed
	$(PY) -m pip install --quiet -e '.[ray]'
	touch $@

# mypy (about 30 s of one core) runs beside pytest, which leaves the second core idle much of the
# time; its report comes after the tests', and either failing fails the target. pytest ends with its
# 20 slowest tests, so that each CI log says where the suite's time went (issue 36, item 14).
test: $(VENV)/.installed $(VENV)/.ray chromium
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/ruff check .
	@typed=$$(mktemp); trap 'rm -f "$$typed"' EXIT; \
	$(VENV)/bin/mypy >"$$typed" 2>&1 & mypy=$$!; \
	$(PY) -m pytest -q --durations=20; tests=$$?; \
	wait $$mypy; typing=$$?; echo "mypy:"; cat "$$typed"; \
	exit $$((tests || typing))

# mypy checks the whole package ([tool.mypy] in pyproject.toml), and the compiler's stages with every
# flag of --strict (an override there: one run, not two). `make strict` runs --strict itself on them.
COMPILER := $(addprefix shapescript/,syntax shapes ops check plan ir lower pipeline.py)
strict: $(VENV)/.installed
	$(VENV)/bin/mypy --strict $(COMPILER)

# The edit loop, in a few minutes: the compiler's tests and the quick ones on one device. Left out:
# worker pools, notebooks, Ray, the browser, the CLI's subprocesses, examples, docs and the fuzzer.
test-fast: $(VENV)/.installed
	$(PY) -m pytest -q -m "not slow" $(addprefix --ignore=tests/,$(SLOW_TESTS))
SLOW_TESTS := several parallel cluster notebook browser lsp docs frontends/test_cli.py frontends/test_no_python.py \
	runtime/test_recorded.py runtime/test_recorded_loop.py examples/test_digits_demo.py \
	examples/test_attention_example.py examples/test_nanogpt_example.py compiler/test_fuzz.py compiler/test_targets.py

# The browser test drives Debian's Chromium (Playwright's own browser download is never used).
chromium:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && { apt-get install -y -q chromium >/dev/null \
		|| { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }; }; } \
		|| { echo "the browser test needs Debian's chromium: sudo apt-get install chromium"; exit 1; }

bench: $(VENV)/.installed
	$(PY) benchmarks/step.py

# On a machine with a GPU: the GPU-only tests, then benchmarks/gpu.py and benchmarks/gpu_gpt.py (without one
# it says so). It uses the python that has the GPU build of torch (PYTHON=..., else .venv's, else python3):
# no CPU install first.
gpu-check:
	scripts/gpu_check.sh

clean:
	rm -rf $(VENV)
