# The two set-up commands of the README: `make demo` and `make test`. Each creates .venv and installs
# what it needs. torch is pinned exactly in pyproject.toml (a range admitting 2.14 pulls a CUDA build).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
EXTRAS_TEST := dev,atari,box2d,mujoco,dmc,actorq,device,tflite,c,contrib,robotics
export PYTHONWARNINGS ?= ignore::DeprecationWarning
# setuptools (fetched by pip's build isolation) reports every editable install as an "InformationOnly"
# warning the user can do nothing about; matched by its message (its category cannot be named at pip's
# start-up, where setuptools is not importable).
# --no-compile: pip would byte-compile every file of ~3.7 GB of packages (torch, ray, jax, tensorflow's
# pieces) at install, 1m55 of the test venv's install here against 42 s without; Python compiles the
# modules a run imports on first import instead and caches them (so the cache is not switched off below).
PIP_INSTALL := PYTHONWARNINGS='ignore:Editable installation,$(PYTHONWARNINGS)' $(BIN)/pip install --quiet --no-compile
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test test-fast system-deps lint typecheck pytest bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed-base: pyproject.toml | $(BIN)/python
	$(PIP_INSTALL) -e .
	touch $@

# mujoco 4 moved its files into mujoco-core; a venv made before the dmc extra capped mujoco below 4 would
# keep mujoco-core 4 owning the same mujoco/ folder as 3.17 (removing it later deletes 3.17's files).
$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	if $(BIN)/pip show --quiet mujoco-core 2>/dev/null; then $(BIN)/pip uninstall --quiet -y mujoco-core mujoco-studio mujoco; fi
	$(PIP_INSTALL) -e '.[$(EXTRAS_TEST)]'
	touch $@ $(VENV)/.installed-base

demo: $(VENV)/.installed-base
	$(BIN)/quarl-edge demo

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# mypy does not follow setuptools' package-dir mapping (nor an editable install's finder), so it checks
# the package as the wheel installs it: built by the real build backend into .cache/typecheck.
# Its output goes to .cache/typecheck.log (make test runs it beside pytest): printed whole if it fails, its
# last line (mypy's count) if it passes.
typecheck: $(VENV)/.installed-test
	rm -rf .cache/typecheck build
	mkdir -p .cache
	@( $(BIN)/pip install --quiet --no-deps --no-build-isolation --target .cache/typecheck . && \
	   cd .cache/typecheck && ../../$(BIN)/mypy --config-file ../../pyproject.toml -p quarl_edge ) \
	   >.cache/typecheck.log 2>&1 || { cat .cache/typecheck.log; echo "typecheck failed"; exit 1; }
	@echo "typecheck: $$(tail -n 1 .cache/typecheck.log)"

# sshd (SSH tier) and qemu-user + debootstrap (emulated board tier), when root on Debian; see .ci/system-deps
system-deps:
	bash .ci/system-deps

# Three workers on the 2-core CI machine: with two, tests waiting on subprocesses, sshd, qemu, Ray and paced
# loops left CPU idle. vmstat through a four-worker run showed the CPU busy all along (0% idle; `time`'s
# user+sys misses the sshd-started qemu and Ray's daemons), and four measured the same as three within this
# machine's noise (fresh clones: -n 3 18:53 and 19:14 wall, -n 4 18:19 and 19:34). Every emulated test in
# one group (one board per host), every other file a group of its own (tests/conftest.py), the emulated
# group first as the longest. The 25 slowest tests are printed at the end.
PYTEST_WORKERS ?= 3
PYTEST_PARALLEL := -n $(PYTEST_WORKERS) --dist loadgroup --no-loadscope-reorder

pytest: $(VENV)/.installed-test
	$(BIN)/pytest -q $(PYTEST_PARALLEL) --durations=25

# typecheck (~40 s on one core) runs beside pytest rather than before it: the two share the CPU, so this
# saves at most its own time (not measured on its own).
test: system-deps lint
	$(MAKE) --no-print-directory -j2 typecheck pytest

# The fast tier (under 3 minutes here): no slow, SSH or emulated-board tests.
test-fast: $(VENV)/.installed-test
	$(BIN)/pytest -q $(PYTEST_PARALLEL) --durations=10 -m "not slow and not emulated and not ssh"

bench: $(VENV)/.installed-test
	$(BIN)/python benchmarks/latency.py

clean:
	rm -rf $(VENV) build .cache .pytest_cache .mypy_cache .ruff_cache out
