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
                libcli11-dev libgtest-dev libbenchmark-dev libopenblas0-pthread \
                libstb-dev

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
CMAKE_ARGS := -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(if $(Torch_DIR),-DTorch_DIR=$(Torch_DIR))

.PHONY: all deps configure build test demo clean install

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

demo: build
	$(BUILD)/mmsp-run -n 4 -- $(BUILD)/mmsp selftest --ring 2 --ulysses 2

install: build
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD)
