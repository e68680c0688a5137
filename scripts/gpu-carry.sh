#!/bin/bash
# Prepares what scripts/gpu-check.sh needs on a GPU machine that has no network and lacks
# some of mmsp's build dependencies: Debian 12 packages downloaded here (apt-get download)
# and unpacked with dpkg -x into .gpu-carry/ (git-ignored), to be carried with the tree.
#   .gpu-carry/headers/   header-only libraries, always used: nlohmann-json, CLI11, stb, gloo,
#                         and libjpeg-turbo 2.1 (headers and libjpeg.so.62: the build tree's RPATH
#                         finds it there)
#   .gpu-carry/gtest/     googletest + googlemock 1.12, used only if the machine has none
#   .gpu-carry/benchmark/ Google Benchmark 1.7.1, used only if the machine has none
# (Mixing the machine's headers with carried libraries of another version failed there:
# ../shared/reference/gpu-machine.md.) About 12 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.gpu-carry
rm -rf "$dest" && mkdir -p "$dest/debs"
unpack() {  # unpack <folder> <package>...
  local into=$1; shift
  (cd "$dest/debs" && apt-get download "$@" >/dev/null)
  for p in "$@"; do dpkg -x "$dest"/debs/"${p}"_*.deb "$dest/$into"; done
}
unpack headers nlohmann-json3-dev libcli11-dev libstb-dev libgloo-dev libjpeg62-turbo-dev libjpeg62-turbo
unpack gtest libgtest-dev libgmock-dev googletest
unpack benchmark libbenchmark-dev
rm -rf "$dest/debs"
du -sh "$dest"
