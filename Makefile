# kvcast: one entry point for setup, tests, P4 builds, generated constants and benchmarks.
PY      ?= .venv/bin/python
P4C     ?= $(shell command -v p4c-bm2-ss 2>/dev/null || { [ -x /opt/p4/bin/p4c-bm2-ss ] && echo /opt/p4/bin/p4c-bm2-ss; })
P4_MAIN := p4src/v1model/kvcast.p4
P4_OUT  := p4src/build
P4_SRC  := $(shell find p4src/shared p4src/v1model -name '*.p4')
P4C_TOFINO ?= $(shell command -v bf-p4c 2>/dev/null || { [ -x /opt/p4-tofino/bin/bf-p4c ] && echo /opt/p4-tofino/bin/bf-p4c; })
P4TEST  ?= $(shell command -v p4test 2>/dev/null || { [ -x /opt/p4/bin/p4test ] && echo /opt/p4/bin/p4test; })

.PHONY: setup demo serve test test-fast p4 p4-tofino constants bench fuzz faults sim-crosscheck lint clean

setup:
	bash scripts/setup.sh

## demo: install what is needed, then the incast experiment on the emulated cluster (root)
demo: setup
	$(PY) -m experiments.incast --out results/demo

## serve: install what is needed, then N real vLLM engines (CPU) share a prefix through the
## switch: time to first token per mode (root; experiments/serving*.py, docs/results.md)
serve: setup
	$(PY) -m experiments.serving --out results/serving --agentic --corrupt-check --switch-kill-check \
	    --dead-pool-check

## test: install what is needed, then run the whole test suite
test: setup
	$(PY) -m pytest -q -ra

test-fast:
	$(PY) -m pytest -q -ra -m "not slow"

## p4: compile the v1model program with p4c-bm2-ss into p4src/build (P4Info + BMv2 JSON)
p4: $(P4_OUT)/kvcast.p4info.txtpb

$(P4_OUT)/kvcast.p4info.txtpb: $(P4_SRC)
	@[ -n "$(P4C)" ] || { echo "p4c-bm2-ss not found (see docs/bmv2.md)"; exit 1; }
	mkdir -p $(P4_OUT)
	$(P4C) --std p4-16 -I p4src $(P4_MAIN) -o $(P4_OUT)/kvcast.json \
	    --p4runtime-files $(P4_OUT)/kvcast.p4info.txtpb

## p4-tofino: compile p4src/tna for Tofino-1 with the bf-p4c driver (p4c's Tofino backend and
## its assembler, which refuses a program over 12 stages) into build/tofino, and write what it
## placed into p4src/build/tofino (summary.json, P4Info, resource logs; docs/tofino.md), and
## build/tofino/kvcast.conf, the device config a Stratum switch is given (docs/tofino.md). The
## P4Info holds standard P4Runtime counters, registers and the digest (what the controller reads).
## CPU_PORT=320 compiles for a 4-pipe part. Where only p4test and TNA's includes exist: the
## front/mid-end check.
CPU_PORT ?=
p4-tofino:
	@if [ -n "$(P4C_TOFINO)" ]; then \
	    rm -rf build/tofino && mkdir -p build/tofino && \
	    $(P4C_TOFINO) --target tofino --arch tna --verbose 1 -I p4src -o build/tofino \
	        $(if $(CPU_PORT),-DCPU_PORT_NUM=$(CPU_PORT)) \
	        --p4runtime-files build/tofino/kvcast.p4info.txtpb --p4runtime-force-std-externs \
	        --bf-rt-schema build/tofino/bf-rt.json p4src/tna/kvcast.p4 && \
	    { [ -f build/tofino/kvcast.conf ] || { gen=$$(dirname $$(readlink -f $(P4C_TOFINO)))/p4c-gen-conf; \
	      [ ! -x "$$gen" ] || (cd build/tofino && $$gen --conf-type BF-RT --bfrt-name bf-rt.json \
	        --name kvcast --device tofino --p4-version p4-16 --outputdir . --pipe pipe); }; } && \
	    $(PY) -m kvcast.tools.tofino_summary build/tofino p4src/build/tofino && \
	    rm -f p4src/build/tofino/uncompiled.json; \
	else \
	    inc=$$($(PY) -c 'from emulation.targets import tna_include_dir as t; print(t() or "")'); \
	    [ -n "$(P4TEST)" ] && [ -n "$$inc" ] || { echo "neither bf-p4c nor p4test with tna.p4 found (docs/tofino.md)"; exit 1; }; \
	    echo "bf-p4c not found: front/mid-end check only (p4test, $$inc)"; \
	    $(P4TEST) --std p4-16 -D__TARGET_TOFINO__ -I p4src -I $$inc --Wdisable=unused p4src/tna/kvcast.p4; \
	fi

## constants: regenerate kvcast/p4constants.py from the P4Info and p4src/shared/defines.p4
constants:
	$(PY) -m kvcast.tools.gen_constants --p4info $(P4_OUT)/kvcast.p4info.txtpb \
	    --defines p4src/shared/defines.p4 --headers p4src/shared/headers.p4 \
	    --sizes p4src/shared/sizes.p4 --out kvcast/p4constants.py

bench: setup
	$(PY) -m benchmarks

## faults: the incast modes under loss, duplication, corruption, reordering and jitter, then the
## switch, controller (also mid-load), pool node and mooncake_master killed during a trace
## replay, and the trace replay under loss and corruption (docs/reliability.md)
faults: setup
	$(PY) -m experiments.faults --out results/faults

## fuzz: 100,000 mutated packets into each parser (reference target, BMv2 where installed,
## pool node, agent); a seeded 2,000 per target runs in the tests (tests/fuzz)
fuzz: setup
	$(PY) -m fuzz --count 100000

## sim-crosscheck: build SimGrid 4.1 from its source distribution into the environment (a C++
## build: cmake, g++, Boost; 10-40 min on two cores; never part of setup), then cross-check the
## flow model against SimGrid's flow-level model on a leaf-spine (docs/fabric.md). SimGrid 4.1's
## bindings need pybind11 2.x; the venv's bin first on PATH makes cmake find its interpreter.
sim-crosscheck: setup
	$(PY) -c 'import simgrid' 2>/dev/null || { \
	    $(PY) -m pip install 'pybind11>=2.4,<3' setuptools && \
	    PATH="$(abspath $(dir $(PY))):$$PATH" $(PY) -m pip install --no-build-isolation simgrid==4.1; }
	$(PY) -m experiments.sim.crosscheck --out results/sim-crosscheck

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

clean:
	rm -rf .pytest_cache .mypy_cache .ruff_cache
