# make demo: partition zoo:gpt-small onto preset:mixed-4, run it under torchrun on CPU, verify.
# make test: the test suite. Both create ./.venv on first use (torch pinned to the CPU build).
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH ?= torch==2.13.0
DEMO_OUT ?= out/demo
# pytest-xdist workers for `make test` (0: serial); see README "Running the tests" and NOTE [xdist groups].
TEST_WORKERS ?= 2

.PHONY: demo test venv clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check "$(TORCH)"
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $@

demo: venv
	$(VENV)/bin/hetpart partition zoo:gpt-small --cluster preset:mixed-4 --out $(DEMO_OUT) --force
	$(VENV)/bin/hetpart run $(DEMO_OUT) --verify

test: venv
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

clean:
	rm -rf $(VENV) out
