# Two commands for a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo demo-ray test install clean

$(STAMP): pyproject.toml constraints/cpu.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -c constraints/cpu.txt -e .
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m app demo

# the tiny model on 2 Ray Train workers of a local Ray instance the command starts and stops (docs/cluster.md)
demo-ray: $(STAMP)
	$(BIN)/python -m app demo --workers 2

# two pytest workers, a test module whole on one (its fixtures built once): the Ray scenario tests spend much of
# their time waiting (cluster start-up, a lost node's detection, a resize), which the other worker fills
test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not gpu" -n 2 --dist loadfile --no-loadscope-reorder

clean:
	rm -rf $(VENV)
