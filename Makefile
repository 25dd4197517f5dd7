# Both targets create .venv on first use: torch's CPU build first (so no CUDA build is pulled),
# then this package in editable mode with its test extra, pinned to the tested set in
# constraints.txt (which leaves torch out), then torchvision's matching build and the timm extra.
# torch: a local 2.13.0 wheel from pip's find-links if there is one (--no-index: nothing is
# fetched), otherwise the CPU build from download.pytorch.org. Both with --no-deps: torch's own
# small dependencies (filelock, sympy, ...) come with the package, under the constraints.
TORCH         := torch==2.13.0
# torchvision's build for that torch, found the same way (timm, the timm extra, imports it). Where
# neither place has it (PyPI's build needs CUDA libraries a CPU torch lacks), the timm extra is
# left out and the encoder=timm:NAME tests skip, saying why.
TORCHVISION   := torchvision==0.28.0
TORCH_CPU_URL := https://download.pytorch.org/whl/cpu
# Where no torchvision build matches the CPU torch (the registries here hold only CUDA builds of
# torchvision, which need CUDA libraries the CPU torch lacks), `make test` runs the encoder=timm
# tests a second time in .venv-timm: torch 2.14.1 and torchvision 0.29.1 (CUDA builds, which run
# on the CPU; pip takes their wheels from the registry or this machine's disk and their CUDA
# libraries from the registry: 5.5 GB, 1 min 51 s here) and timm, with every other package read
# from .venv (a .pth file), so both runs test the same code.
TIMM_TORCH    := torch==2.14.1 torchvision==0.29.1
TIMM_VENV     := .venv-timm
TIMM_STAMP    := $(TIMM_VENV)/.installed
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

export RAY_USAGE_STATS_ENABLED := 0
export RAY_AUTH_MODE := disabled

.PHONY: demo data test test-fast bench gpu-wheels clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --no-deps --no-index '$(TORCH)' \
	  || $(BIN)/pip install --quiet --no-deps '$(TORCH)' --index-url $(TORCH_CPU_URL)
	$(BIN)/pip install --quiet -e '.[test]' -c constraints.txt
	( $(BIN)/pip install --quiet --no-deps --no-index '$(TORCHVISION)' \
	  || $(BIN)/pip install --quiet --no-deps '$(TORCHVISION)' --index-url $(TORCH_CPU_URL) ) \
	  && $(BIN)/python -c 'import torchvision' 2>/dev/null \
	  && $(BIN)/pip install --quiet -e '.[test,timm]' -c constraints.txt \
	  || { $(BIN)/pip uninstall --quiet --yes torchvision; \
	       echo "make: no $(TORCHVISION) build for $(TORCH) here: encoder=timm:NAME and its tests are skipped"; }
	touch $(STAMP)

# Made only where .venv cannot import timm; a failed install leaves the timm tests skipped.
$(TIMM_STAMP): $(STAMP)
	@if $(BIN)/python -c 'import timm' 2>/dev/null; then mkdir -p $(TIMM_VENV) && touch $@; exit 0; fi; \
	{ test -x $(TIMM_VENV)/bin/python || $(PYTHON) -m venv $(TIMM_VENV); } \
	&& $(TIMM_VENV)/bin/pip install --quiet $(TIMM_TORCH) 'timm>=1.0.31,<2' \
	&& echo "import site; site.addsitedir('$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')')" \
	     > "$$($(TIMM_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/zz_mae_study_venv.pth" \
	&& $(TIMM_VENV)/bin/python -c 'import timm, mae_core' \
	&& touch $@ \
	|| echo "make: could not build $(TIMM_VENV): the encoder=timm tests stay skipped"

# Fashion-MNIST where it can be had: already here (dataset=fashion_mnist finds it), Debian's
# package where this runs as root with apt (Debian, Ubuntu), else `mae-study fetch` (Zalando's
# files, each checked by SHA-256). Where none works, one line says the demo stays on digits.
data: $(STAMP)
	@if $(BIN)/python -c 'from mae_core.named_datasets import locate; locate("fashion_mnist")' 2>/dev/null; then \
	  echo "make: Fashion-MNIST found"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	     && { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist \
	          || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist; }; } >/dev/null 2>&1; then \
	  echo "make: Fashion-MNIST installed (apt-get install dataset-fashion-mnist)"; \
	elif $(BIN)/mae-study fetch fashion_mnist; then :; \
	else echo "make: no Fashion-MNIST (apt and mae-study fetch both failed): the demo runs mask_ratio on digits"; fi

# The demo: fashion_mask_ratio (MAE Figure 5 on Fashion-MNIST, 11 min on two cores, measured once,
# report included) where `data` found or installed Fashion-MNIST, else mask_ratio on digits (`data`
# has already said so in one line).
DEMO_STUDY := fashion_mask_ratio
demo: $(STAMP) data
	@if $(BIN)/python -c 'from mae_core.named_datasets import locate; locate("fashion_mnist")' 2>/dev/null; then \
	  study=$(DEMO_STUDY); \
	else study=mask_ratio; fi; \
	$(BIN)/mae-study run $$study && $(BIN)/mae-study report $$study

# Two xdist processes, each file on one (--dist loadfile): a file's module fixtures are made once,
# and each process starts its own local Ray (two coexist; tests bind no fixed port).
test: $(STAMP) $(TIMM_STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadfile --durations=25
	@if [ -f $(TIMM_STAMP) ] && [ -x $(TIMM_VENV)/bin/python ] && ! $(BIN)/python -c 'import timm' 2>/dev/null; then \
	  echo "make: the encoder=timm tests, in $(TIMM_VENV) ($(TIMM_TORCH))"; \
	  $(TIMM_VENV)/bin/python -m pytest -k timm -p no:cacheprovider; fi

# The inner loop: everything but Ray, subprocesses and scenarios (tests/scenarios): 87 s on two idle
# cores on a fresh clone (`/usr/bin/time make test-fast`, 2026-12-06); `make test` took 765-889 s there.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" -n auto --maxprocesses 4 --dist loadscope

bench: $(STAMP)
	$(BIN)/pip install --quiet -e '.[test,bench]' -c constraints.txt
	$(BIN)/mae-study bench

# Wheels the bare GPU image lacks, for benchmarks/gpu_check.sh (carried by the device tool).
# Needs only pip (no .venv): python3 -m pip download.
# The second set: `mae-study train` (MLflow on SQLite: MLflow's dataset inputs need pandas, the
# reconstruction figures matplotlib) with every dependency the image may lack, less numpy and
# pillow (torch's and torchvision's, on the image) and the first set's wheels: the two sets are
# about 60 MB, under the device check's 64 MiB carry (the last line says how much).
GPU_PLATFORMS = --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64
gpu-wheels:
	python3 -m pip download --quiet --only-binary=:all: --python-version 3.12 --no-deps -d .gpu-wheels \
	  -c constraints.txt pydantic pydantic_core annotated-types typing-inspection typing_extensions pyyaml \
	  rich markdown-it-py mdurl Pygments
	python3 -m pip download --quiet --only-binary=:all: --python-version 3.12 $(GPU_PLATFORMS) -d .gpu-wheels/mlflow \
	  -c constraints.txt mlflow-skinny sqlalchemy alembic matplotlib pandas
	cd .gpu-wheels/mlflow && rm -f numpy-*.whl pillow-*.whl $$(cd .. && ls *.whl)
	du -sh .gpu-wheels

clean:
	rm -rf $(VENV) $(TIMM_VENV) build *.egg-info
