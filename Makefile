# The two commands a newcomer needs (see README.md):
#   make serve   set up .venv, build the tiny models if missing, serve tiny-omni
#   make test    set up .venv and run the whole test suite (TEST_WORKERS=2: modules side by side)
#   make test-fast  the edit loop: every test but those on real model engines or marked slow
#   make lint    ruff (lint and format check), and mypy (strict on events, orchestrator, transport, replay, trace)
.PHONY: setup serve test test-fast lint

setup:
	@bash scripts/setup.sh

serve: setup
	.venv/bin/omnix serve

# TEST_WORKERS=2 runs modules side by side (pytest-xdist, a module to a
# worker: its module- and session-scoped servers stay with it; the longest,
# starts_first, first).  On 2 cores two workers take the suite from ~44 to
# ~30 minutes, but under their load a test that races the tiny models'
# speed can lose (the playground's spoken interruption, once in three
# runs); three starve the servers' heartbeats.  One by default (README.md).
TEST_WORKERS ?= 1
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
