# rigd — the two commands a newcomer needs are `make run` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export RIGD_CACHE_DIR ?= $(HOME)/.cache/rigd
PORT ?= 8470
# Root runs QEMU as per-rig uids, which cannot enter a private home: keep data in /var/lib.
DATA_DIR ?= $(if $(filter 0,$(shell id -u)),/var/lib/rigd,$(HOME)/.local/share/rigd)

.PHONY: run test lint images images-all images-desktop images-browser bench deps venv unit integration clean-cache help

help:
	@echo "make run    - install what is missing, build images, start the server"
	@echo "make test   - install what is missing and run lint + the whole test suite"
	@echo "make images - build the default terminal image, kernel, initramfs and tools disk"
	@echo "make images-browser - build the Chromium, Firefox and WebKit browser images (a server also builds them on first use)"
	@echo "make bench  - benchmarks (ratios against raw QEMU and qemu-guest-agent; warm vs cold starts, park/wake; lanes; MCP vs tools.call; registry pulls vs skopeo; ports: a forward vs the guest direct; TCG one thread per vCPU vs per machine; opens: pool hit vs standby vs cold, the CLI vs curl; fork vs warm opens vs cold boots)"
	@echo "make lint   - ruff and mypy --strict"
	@echo "scripts/test-budget - where the last make test spent its time (per image step, per test module)"

deps:
	@scripts/install-deps.sh

# A fresh checkout copies a dependencies-only venv kept under the cache dir per pyproject.toml
# (scripts/venv: ~5 s instead of ~20 s of pip); an existing .venv is updated in place.
$(BIN)/.installed: pyproject.toml
	@PYTHON=$(PYTHON) scripts/venv $(VENV)
	@touch $@

venv: deps $(BIN)/.installed

# Each image step's time goes to the test budget (scripts/timed; scripts/test-budget shows it).
images: venv
	@scripts/timed terminal+kernel+tools $(BIN)/rigd images build

# The computer (desktop) image: ~2.5 minutes cold; the desktop tests boot it. After `images`
# (whose pinned .debs and private apt lists it reuses), so it may build beside the browsers.
images-desktop: images
	@scripts/timed desktop $(BIN)/python -m rigd.images desktop

# The browser images, one per engine (~2 minutes each cold); the browser tests boot them (a
# server builds an engine's image on its first rig when absent).
images-browser: images-browser-chromium images-browser-firefox-esr images-browser-webkit2gtk-driver
images-browser-%: images
	@scripts/timed browser-$* $(BIN)/python -m rigd.images browser --engine $*

# Every image make test boots, two builds at a time (a fresh machine builds them in ~6
# minutes instead of ~10; each target's output is printed whole when it ends).
images-all: images
	@$(MAKE) --no-print-directory -j2 -Otarget images-desktop images-browser

run: images images-desktop
	@if $(BIN)/rigd accel-probe; then accel=""; \
	else echo "rigd: no working hardware acceleration here (see the line above);"; \
	     echo "rigd: starting with --accel tcg: software emulation, fine for development, NOT a security boundary."; \
	     accel="--accel tcg"; fi; \
	exec $(BIN)/rigd serve --data-dir "$(DATA_DIR)" --port $(PORT) $$accel

# mypy's cache lives with the images' (outside the clone): its entries are checked by the
# sources' hashes, so a fresh clone reuses them (a cold check is ~10 s here, a warm one ~1 s).
lint: venv
	$(BIN)/ruff check .
	$(BIN)/mypy --cache-dir "$(RIGD_CACHE_DIR)/mypy"

# Two pytest-xdist workers: one test module (and every test of the shared desktop) per worker at
# a time, the heaviest first (tests/conftest.py). PYTEST_WORKERS=0 runs everything in one process.
PYTEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(PYTEST_WORKERS)),-p no:xdist,-n $(PYTEST_WORKERS) --no-loadscope-reorder)

unit: venv
	$(BIN)/pytest -q $(XDIST) tests/unit

integration: images-all
	$(BIN)/pytest -q $(XDIST) tests/integration

# The run ends with the slowest 25 items and the total, then the budget: time per image step and
# per test module, against the run before (scripts/test-budget).
test: images-all lint
	@$(BIN)/pytest -q --durations=25 $(XDIST) tests/unit tests/integration; rc=$$?; \
	scripts/test-budget --top 0 --modules 15 || true; exit $$rc

bench: images images-desktop
	$(BIN)/python bench/terminal.py; a=$$?; $(BIN)/python bench/lifecycle.py; b=$$?; $(BIN)/python bench/netgate.py; c=$$?; \
	$(BIN)/python bench/computer.py; d=$$?; $(BIN)/python bench/lanes.py; e=$$?; \
	$(BIN)/python bench/agents.py; f=$$?; $(BIN)/python bench/images.py; g=$$?; \
	$(BIN)/python bench/ports.py; h=$$?; $(BIN)/python bench/tcg.py; i=$$?; \
	$(BIN)/python bench/open.py; j=$$?; $(BIN)/python bench/fork.py; k=$$?; \
	$(BIN)/python bench/marks.py; l=$$?; \
	exit $$(( a || b || c || d || e || f || g || h || i || j || k || l ))

clean-cache:
	rm -rf "$(RIGD_CACHE_DIR)"
