#!/usr/bin/env bash
# Builds mmsp from a clean clone and runs its whole test suite against LibTorch 2.x:
# Debian 13 ("trixie") ships libtorch-dev 2.6, so this makes a Debian 13 root with
# debootstrap (from the mirror this machine's apt already uses, nothing else), installs
# the project's packages there, clones the repository into it and runs `make test`.
# Needs root (debootstrap, chroot, bind mounts). The root is kept for the next run:
#   TORCH2_ROOT   where the Debian 13 root lives (default /var/tmp/mmsp-trixie)
#   TORCH2_JOBS   build jobs inside the root (default: nproc)
# Usage: scripts/test-torch2.sh  (or: make test-torch2)
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
root=${TORCH2_ROOT:-/var/tmp/mmsp-trixie}
jobs=${TORCH2_JOBS:-$(nproc)}
[ "$(id -u)" = 0 ] || { echo "test-torch2: needs root (debootstrap, chroot, mounts)" >&2; exit 2; }

# The Debian mirror apt is configured with (deb822 sources or the classic list).
mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
[ -n "$mirror" ] || mirror=$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
[ -n "$mirror" ] || { echo "test-torch2: no Debian mirror in apt's sources" >&2; exit 2; }

if [ ! -x "$root/usr/bin/apt-get" ]; then
  command -v debootstrap > /dev/null || { apt-get update -q && apt-get install -y -q debootstrap; }
  echo "test-torch2: making a Debian 13 root in $root"
  debootstrap --variant=minbase trixie "$root" "$mirror"
fi

mounted=()
cleanup() {
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[$i]}" 2> /dev/null || true; done
}
trap cleanup EXIT
for m in proc sys dev dev/pts; do
  mkdir -p "$root/$m"
  mountpoint -q "$root/$m" || { mount --bind "/$m" "$root/$m" && mounted+=("$root/$m"); }
done
cp /etc/resolv.conf "$root/etc/resolv.conf" 2> /dev/null || true

# The project's packages (the Makefile's list) plus what cloning and building need.
packages=$(make -s -C "$src" print-deb-packages)
chroot "$root" env DEBIAN_FRONTEND=noninteractive bash -c \
  "apt-get update -q && apt-get install -y -q --no-install-recommends $packages git make ca-certificates"
chroot "$root" dpkg-query -W -f='test-torch2: ${Package} ${Version}\n' libtorch-dev

# A clean clone of the committed tree, as CI builds it.
rm -rf "$root/work/mmsp"
mkdir -p "$root/work"
git clone -q "$src" "$root/work/mmsp"
start=$(date +%s)
chroot "$root" env -C /work/mmsp make test JOBS="$jobs"
echo "test-torch2: build and tests against LibTorch 2.x took $(( $(date +%s) - start )) s"
