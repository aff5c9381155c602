# The lecture series in a few targets. Each builds .venv first when it is missing or out of date.
#   make html   execute every lecture and render the site into build/html/ (SMOKE=1: small sizes;
#               SAVE_TO=data/NAME: the lectures that measure hardware keep their numbers there)
#   make images the same, at full sizes, keeping each lecture's key figure in images/ and the README
#   make test   unit tests of helpers/ and every notebook executed headless (what CI runs); the site
#               and, in JupyterLab, the lectures that draw widgets (LAB=all: every lecture)
#   make lab    JupyterLab on notebooks/ with the project's environment
#               (on a remote GPU node: make lab LAB_ARGS="--no-browser --ip=0.0.0.0")
#   make bench  every performance goal, measured and printed as ratios (bench/*.py)
#   make clean  remove build/ and .venv/
# GPU users pick their torch build, e.g.:
#   make html TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"

PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
UV     := uv==0.13.9
SMOKE  ?= 0
SAVE_TO ?=
LAB_ARGS ?=
LAB ?=
BIN    := $(VENV)/bin
READY  := $(VENV)/.ready

.PHONY: env html images test lab bench clean
.DEFAULT_GOAL := html

env: $(READY)

# torch with pip (TORCH takes pip's arguments, e.g. an --index-url); the rest with uv, which installs
# the same pinned packages as pip in a tenth of the time (5 s against 40 s here), torch already in place.
# Bytecode: where PYTHONDONTWRITEBYTECODE is set (as on the course's VMs) nothing writes a module's
# .pyc after the install, so a package installed without them is compiled again by every process
# that imports it (matplotlib: 3.2 s against 0.7 s per kernel start here). uv compiles what it
# installs (--compile-bytecode); torch and what pip installed with it (sympy, networkx, jinja2, ...),
# installed without compiling, are compiled on both cores meanwhile (pip compiles on one: 40 s for
# torch, against 23 s plus this; the environment takes 46 s in all, against 67 s). sympy among them:
# uncompiled, every process that imports DTensor, FSDP or DCP spends 1 s more compiling it (3.3 s
# against 2.3 s here). A file that does not compile is left to import time.
PLATLIB = $$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("platlib"))')
$(READY): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --no-compile $(TORCH)
	$(BIN)/python -m pip install --quiet $(UV)
	{ $(BIN)/python -m compileall -q -j 0 $$(ls -d $(PLATLIB)/*) >/dev/null & } ; \
	$(BIN)/python -m uv pip install --python $(BIN)/python --quiet --compile-bytecode -r requirements.txt && wait
	$(BIN)/python -m uv pip install --python $(BIN)/python --quiet --no-deps -e .
	touch $@

html: $(READY)
	$(BIN)/python -m helpers.site --out build/html $(if $(filter 1 true yes,$(SMOKE)),--smoke) \
		$(if $(SAVE_TO),--save-to $(SAVE_TO))

images: $(READY)
	$(BIN)/python -m helpers.site --out build/html --images

# make test in two phases, so that no timed test or lecture shares the cores with other tests:
# 1. what times nothing, in three streams at once: the tests marked `beside` (tests/test_lecture_16.py:
#    a hang under torchrun, checkpoints across mesh shapes; tests/test_cluster.py: two torchrun
#    agents as two nodes; lecture 01's runs, with two hangs each; they mostly wait; and lecture 12
#    at WORLD_SIZE=3, to even the streams: tests/test_notebooks.py's BALANCED) at a lower priority
#    (nice 10); the lectures that assert no timing (marked `untimed` in tests/test_notebooks.py: 10,
#    11, 12, 13, 16, with their other world sizes); and, in the foreground, UNTIMED (the launcher's
#    hangs and kills, programs and counts checked exactly, the conventions; the waiting ones first,
#    so that the streams share idle cores);
# 2. after all three: everything else (every timed test and lecture, JupyterLab's run of the lectures
#    with widgets, whose timed checks a second stream moved by 30 % once, and the site), one after
#    another, alone.
# The lectures of both phases are executed into EXECUTED_DIR, which the site test renders.
# `pytest tests` runs them all in one process.
UNTIMED = tests/test_spawn.py tests/test_nd3d.py tests/test_fake_mesh.py \
	tests/test_lecture_13.py tests/test_zero_wrappers.py tests/test_planner.py tests/test_lecture_01.py \
	tests/test_lecture_10.py tests/test_lecture_11.py tests/test_lecture_12.py \
	tests/test_consistency.py tests/test_shape.py tests/test_saved.py tests/test_environment.py \
	tests/test_wrappers_real_model.py tests/test_quoted.py tests/test_lecture_14.py \
	tests/test_planner_memory.py tests/test_layout.py tests/test_recording.py tests/test_negative_controls.py
PYTEST = $(BIN)/python -m pytest -ra -p no:cacheprovider
test: $(READY)
	@rm -rf build/test-executed build/test-*-tmp; mkdir -p build
	export LAB=$(LAB) EXECUTED_DIR=$(CURDIR)/build/test-executed; \
	nice -n 10 $(PYTEST) --durations=5 --basetemp build/test-beside-tmp -m beside tests \
		>build/test-beside.log 2>&1 & beside=$$!; \
	$(PYTEST) --durations=5 --basetemp build/test-untimed-tmp -m "untimed and not beside" \
		tests/test_notebooks.py >build/test-untimed.log 2>&1 & lectures=$$!; \
	trap 'kill $$beside $$lectures 2>/dev/null' INT TERM; \
	$(PYTEST) --durations=5 -m "not beside" $(UNTIMED); untimed=$$?; \
	wait $$lectures; quiet=$$?; echo "--- beside it, the lectures that time nothing (build/test-untimed.log):"; \
	cat build/test-untimed.log; \
	wait $$beside; side=$$?; echo "--- beside it (build/test-beside.log):"; cat build/test-beside.log; \
	$(PYTEST) --durations=15 -m "not beside and not untimed" $(addprefix --ignore=,$(UNTIMED)) tests; \
	timed=$$?; \
	[ $$untimed -eq 0 ] && [ $$quiet -eq 0 ] && [ $$side -eq 0 ] && [ $$timed -eq 0 ]

lab: $(READY)
	cd notebooks && ../$(BIN)/jupyter lab $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

bench: $(READY)
	for script in launch collectives ddp planner series; do $(BIN)/python bench/$$script.py || exit 1; done

clean:
	rm -rf build $(VENV)
