# mmsp — the two commands a user needs:  `make demo`  and  `make test`.
# Each installs what is missing (Debian 12 packages), configures CMake and builds.
# Another LibTorch (e.g. a CUDA build):  make test Torch_DIR=/path/to/libtorch/share/cmake/Torch

BUILD      ?= build
BUILD_TYPE ?= Release
JOBS       ?= $(shell nproc)
Torch_DIR  ?=

# Debian 12 packages the project builds and runs with. libopenblas0-pthread makes
# LibTorch's fp32 matmul ~20x faster than the reference BLAS (see docs/building.md).
DEB_PACKAGES := cmake ninja-build g++ ccache libtorch-dev libgloo-dev nlohmann-json3-dev \
                libcli11-dev libgtest-dev libgmock-dev libbenchmark-dev libopenblas0-pthread \
                libstb-dev

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
CMAKE_ARGS := -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(if $(Torch_DIR),-DTorch_DIR=$(Torch_DIR))

.PHONY: all deps configure build tools test demo clean install test-torch2 print-deb-packages

all: build

deps:
	@missing=$$(for p in $(DEB_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing:" $$missing; \
	  $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends $$missing; \
	fi

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) $(CMAKE_ARGS)

configure: deps $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j 2 --timeout 600

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

install: build
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD)

# The whole suite against LibTorch 2.x (Debian 13's libtorch-dev) in a debootstrap root,
# from a clean clone: docs/building.md. Needs root; not part of `make test`.
test-torch2:
	scripts/test-torch2.sh

print-deb-packages:
	@echo $(DEB_PACKAGES)
