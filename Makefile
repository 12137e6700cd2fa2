# Two commands for a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install clean

$(STAMP): pyproject.toml constraints/cpu.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -c constraints/cpu.txt -e .
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	RAY_AUTH_MODE=disabled $(BIN)/python -m app demo

test: $(STAMP)
	RAY_AUTH_MODE=disabled $(BIN)/python -m pytest -q -m "not gpu"

clean:
	rm -rf $(VENV)
