# Two commands for a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo demo-ray test install clean

# glibc's defaults give the eager reference ops' multi-MB temporaries back to the kernel at every free (mmap above
# a threshold, trimming the heap's top), so each new one page-faults afresh; kept in the heap, a tiny CPU step costs
# about a fifth less (docs/perf.md). Where memory comes from changes no arithmetic, so no bit. Ray's workers inherit it.
export MALLOC_MMAP_THRESHOLD_ := 33554432
export MALLOC_TRIM_THRESHOLD_ := 1073741824
export MALLOC_TOP_PAD_ := 67108864
# OpenMP's threads spin while they wait for work: with more busy threads than cores (two test workers, Ray's workers,
# a 2-thread run beside them) the spinning ones take the cores from the working ones, and a 2-thread tiny step took
# 3.3 s instead of 0.3 s here. Waiting passively changes the schedule, not the arithmetic: no bit changes.
export OMP_WAIT_POLICY := PASSIVE

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
