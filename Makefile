# The two commands a newcomer needs (see README.md):
#   make serve   set up .venv, build the tiny models if missing, serve tiny-omni
#   make test    set up .venv and run the whole test suite, two modules side by side
#   make test-fast  the edit loop: every test but those on real model engines or marked slow
#   make lint    ruff (lint and format check), and mypy (strict on events, orchestrator, transport, replay, trace)
.PHONY: setup serve test test-fast lint

setup:
	@bash scripts/setup.sh

serve: setup
	.venv/bin/omnix serve

# Two test workers run modules side by side (pytest-xdist, a module to a
# worker: its module- and session-scoped servers stay with it; the longest,
# starts_first, first): on 2 cores ~22 minutes (the servers' workers fork
# warm from a zygote, docs/runtime.md); three starve the servers'
# heartbeats.  TEST_WORKERS=1: one module after another.
TEST_WORKERS ?= 2
XDIST = $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder,)

test: setup
	@bash scripts/test-deps.sh
	.venv/bin/python -m pytest -q -p no:cacheprovider --durations=25 $(XDIST)

test-fast: setup
	.venv/bin/python -m pytest -q -p no:cacheprovider -m "not engines and not slow"

lint: setup
	.venv/bin/ruff check omnix tests
	.venv/bin/ruff format --check omnix tests
	.venv/bin/mypy
