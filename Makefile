# Both targets create .venv on first use: torch's CPU build first (so no CUDA build is pulled),
# then this package in editable mode with its test extra.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

export RAY_USAGE_STATS_ENABLED := 0
export RAY_AUTH_MODE := disabled

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/mae-study run mask_ratio
	$(BIN)/mae-study report mask_ratio

test: $(STAMP)
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/pip install --quiet -e '.[test,bench]'
	$(BIN)/mae-study bench

clean:
	rm -rf $(VENV) build *.egg-info
