#!/bin/sh
# Runs the command; when it fails only because this machine has no CUDA device (the
# message rank_device.cpp gives), exits 77, which ctest reports as skipped.
out=$("$@" 2>&1); rc=$?
printf '%s\n' "$out"
if [ $rc -ne 0 ] && printf '%s' "$out" | grep -q "sees no CUDA device"; then
  echo "skipped: no CUDA device on this machine"
  exit 77
fi
exit $rc
