#!/usr/bin/env bash
# `pip install --no-build-isolation <checkout>` into a fresh venv that already holds the
# pinned torch, then from outside the checkout: mmsp imports from that venv (not the source
# tree), and one patched step runs from it (tests/package/pip_step.py).
#   pip_install.sh <python with requirements/*.txt> <checkout> <build dir> [NAME=VALUE ...]
# NAME=VALUE: CMake definitions for pip's build (-C cmake.define.NAME=VALUE).
# The fresh venv gets the project's packages (torch, transformers, scikit-build-core) through
# a .pth line to <python>'s site-packages: the same pinned torch without a second 3 GB
# download. The package's build folder is <build dir>-pip, a sibling of the suite's build
# folder at the same depth: with ccache's base_dir (CMakeLists.txt's launcher) its compiles
# are the suite's, found in the cache, as long as the compiler and flags are the same (hence
# the definitions: the suite's compiler, which pip would otherwise take from Python's
# sysconfig, g++ rather than c++, and its MMSP_WERROR).
set -euo pipefail
python=$1 src=$2 build=$3
shift 3
defines=()
for d in "$@"; do defines+=(-C "cmake.define.$d"); done
work=$(mktemp -d)
pip_build="$build-pip"
trap 'rm -rf "$work" "$pip_build"' EXIT
"$python" -m venv "$work/venv"
base_site=$("$python" -c 'import site; print(site.getsitepackages()[0])')
site=$("$work/venv/bin/python" -c 'import site; print(site.getsitepackages()[0])')
echo "$base_site" > "$site/_mmsp_test_base_packages.pth"
start=$(date +%s)
"$work/venv/bin/python" -m pip install --disable-pip-version-check --no-input --no-cache-dir \
  --no-build-isolation -C build-dir="$pip_build" "${defines[@]}" "$src" \
  > "$work/pip.log" 2>&1 || { cat "$work/pip.log"; echo "pip install failed" >&2; exit 1; }
echo "pip install: $(( $(date +%s) - start )) s"
"$work/venv/bin/python" -m pip show mmsp | sed -n '1,3p'
cd "$work"  # not the checkout: nothing may come from the source tree's python/
"$work/venv/bin/python" "$src/tests/package/pip_step.py" "$site" "$src"
