# mmsp — the two commands a user needs:  `make demo`  and  `make test`.
# Each installs what is missing, configures CMake and builds: Debian 12 packages (the
# compiler, CMake, the header-only and test libraries) and LibTorch, which comes from the
# pinned `torch` wheel (requirements/torch.txt) installed into a project-local virtual
# environment (.venv; `make clean` keeps it) with the pinned transformers, tokenizers and
# pytest (requirements/hf.txt) that the suite compares against and `mmsp prepare` runs.
# See docs/building.md.
# Another LibTorch (>= 2.11, e.g. the GPU machine's):  make test Torch_DIR=/path/to/share/cmake/Torch
# (then the Python tests use $(PYTHON), which must have requirements/hf.txt's packages).

BUILD      ?= build
BUILD_TYPE ?= Release
JOBS       ?= $(shell nproc)
Torch_DIR  ?=
PYTHON     ?= python3
VENV       ?= .venv

# Debian 12 packages the project builds and runs with. libgloo-dev: c10d's Gloo header
# includes Gloo's, which the wheel does not ship. python3-venv: Debian's python3 makes
# no venv without it. python3-dev: Python's headers, for the `mmsp` package's extension.
# openmpi-bin and iproute2: the two-host tests (tests/dist/multihost.sh) start ranks with
# OpenMPI's mpirun, as docs/launcher.md's recipe, between network namespaces. FFmpeg's -dev
# packages (found by pkg-config): mmsp train decodes video files (train/data/video_file.h).
# clang and libclang-rt-14-dev: the test fuzz.smoke builds the parsers' libFuzzer targets
# with clang++ (tests/fuzz); libFuzzer and the sanitizers' runtimes are in the second,
# which clang's packages only recommend (deps installs with --no-install-recommends).
# clang-format (14 on Debian 12): the suite's design.style holds the C++ to .clang-format.
DEB_PACKAGES := cmake ninja-build g++ ccache libgloo-dev nlohmann-json3-dev \
                libcli11-dev libgtest-dev libgmock-dev libbenchmark-dev libstb-dev libjpeg-dev python3-venv \
                python3-dev openmpi-bin iproute2 clang clang-format libclang-rt-14-dev \
                pkg-config libavformat-dev libavcodec-dev libavfilter-dev libswscale-dev libavutil-dev

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# Debian 12's FFmpeg 5.1 runtime libraries: torchcodec's libtorchcodec_core5.so
# (requirements/hf.txt) links all seven, and transformers and `mmsp prepare` decode video
# files with it. A line of its own, apart from the list above, which the C++ decoder's -dev
# packages extend.
DEB_PACKAGES += libavcodec59 libavformat59 libavutil57 libswscale6 libswresample4 libavfilter8 libavdevice59

# WERROR=OFF builds with a compiler whose new warnings the code has not met yet.
WERROR    ?= ON
CMAKE_ARGS := -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DMMSP_WERROR=$(WERROR)

# The venv is (re)made when the pins change; its stamp records the pins it holds.
TORCH_STAMP := $(VENV)/.mmsp-requirements
REQUIREMENTS := requirements/torch.txt requirements/hf.txt
ifeq ($(Torch_DIR),)
TORCH_DEP := $(TORCH_STAMP)
TORCH_DIR_ARG = -DTorch_DIR=$$(echo $(CURDIR)/$(VENV)/lib/python3*/site-packages/torch/share/cmake/Torch) \
                -DMMSP_PYTHON=$(CURDIR)/$(VENV)/bin/python
else
TORCH_DEP :=
TORCH_DIR_ARG = -DTorch_DIR=$(Torch_DIR) -DMMSP_PYTHON=$$(command -v $(PYTHON))
endif

.PHONY: all deps torch configure build tools python peers test demo clean install print-deb-packages

all: build

deps:
	@missing=$$(for p in $(DEB_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing:" $$missing; \
	  $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends $$missing; \
	fi

# pip's own download and install; the size is in docs/building.md, the time in
# docs/bench/libtorch.md. No pip cache: the wheels (3.0 GB) would otherwise sit twice on the
# disk (a CI run failed on a full disk).
$(TORCH_STAMP): $(REQUIREMENTS) | deps
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --disable-pip-version-check --no-input --progress-bar off --no-cache-dir \
	  --only-binary :all: $(addprefix -r ,$(REQUIREMENTS))
	cat $(REQUIREMENTS) > $@

torch: $(TORCH_DEP)

$(BUILD)/build.ninja: $(TORCH_DEP)
	cmake -S . -B $(BUILD) $(CMAKE_ARGS) $(TORCH_DIR_ARG)

configure: deps torch $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j 2

# The demo: the built-in Qwen2-VL-style model learns the shapes dataset on 4 ranks
# (ring 2 × ulysses 2), then the first steps again on 1 rank with the same batches.
DEMO_DIR    ?= runs/demo
DEMO_STEPS  ?= 300
DEMO_CHECK  ?= 20
# The largest relative difference of the per-step losses, 4 ranks against 1, that the
# demo accepts (compare-losses exits 1 above it). fp32 rounds at 2^-24 ≈ 6e-8 relative,
# and the two runs sum in other orders: measured 2026-11-23, steps 1-20 differ by
# 0 to 1.4e-7 (step 11; most 2e-8 to 8e-8), not growing with the step. 1e-5 leaves a 70×
# margin, while a sharding, mask or normalisation error moves the loss by 1e-3 or more.
DEMO_MAX_REL ?= 1e-5

# Only the two tools: the demo does not wait for the test binaries to compile.
tools: configure
	cmake --build $(BUILD) -j $(JOBS) --target mmsp mmsp-run

demo: tools
	rm -rf $(DEMO_DIR)
	$(BUILD)/mmsp-run -n 4 -- $(BUILD)/mmsp train --ring 2 --ulysses 2 --steps $(DEMO_STEPS) \
	  --tokens-per-rank 128 --out $(DEMO_DIR)/4-ranks
	@echo "== the first $(DEMO_CHECK) steps again on 1 rank (same batches: 4 x 128 tokens per step) =="
	$(BUILD)/mmsp train --steps $(DEMO_STEPS) --stop-after $(DEMO_CHECK) --tokens-per-rank 512 \
	  --out $(DEMO_DIR)/1-rank --quiet
	$(BUILD)/mmsp compare-losses $(DEMO_DIR)/4-ranks/metrics.jsonl $(DEMO_DIR)/1-rank/metrics.jsonl \
	  --max-rel $(DEMO_MAX_REL)
	@echo "== the two runs' curves, overlaid: $(DEMO_DIR)/report.png and report.html =="
	$(BUILD)/mmsp report $(DEMO_DIR)/4-ranks $(DEMO_DIR)/1-rank --out $(DEMO_DIR)/report

# `import mmsp` from .venv's Python: builds the package (<build>/python/mmsp: the Python
# files and the mmsp._C extension, against .venv's torch) and puts it on that Python's path
# with a .pth file. With Torch_DIR=..., PYTHON's site-packages get the .pth instead.
python: configure
	cmake --build $(BUILD) -j $(JOBS) --target mmsp_python
	site=$$($(if $(Torch_DIR),$(PYTHON),$(VENV)/bin/python) -c 'import site; print(site.getsitepackages()[0])') && \
	  echo "$(CURDIR)/$(BUILD)/python" > "$$site/mmsp-build.pth" && echo "mmsp: $$site/mmsp-build.pth -> $(CURDIR)/$(BUILD)/python"

# The peers benchmark (bench/peers, docs/bench/peers.md): transformers alone, with DeepSpeed's
# Ulysses, patched by mmsp, and mmsp train, on one model, batch and 4-rank CPU mesh.
# DeepSpeed is built from its pinned source package (requirements/peers.txt says why).
PEERS_STAMP := $(VENV)/.mmsp-peers
PEERS_OUT   ?= $(BUILD)/peers.json
$(PEERS_STAMP): requirements/peers.txt $(TORCH_STAMP)
	DS_BUILD_OPS=0 $(VENV)/bin/pip install --disable-pip-version-check --no-input --progress-bar off \
	  --no-cache-dir --only-binary :all: --no-binary deepspeed --no-build-isolation \
	  -r requirements/peers.txt $(addprefix -c ,$(REQUIREMENTS))
	cp requirements/peers.txt $@

peers: python $(PEERS_STAMP)
	cmake --build $(BUILD) -j $(JOBS) --target mmsp mmsp-run
	$(VENV)/bin/python bench/peers/peers.py --build $(BUILD) --out $(PEERS_OUT)

install: build
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD)

print-deb-packages:
	@echo $(DEB_PACKAGES)
