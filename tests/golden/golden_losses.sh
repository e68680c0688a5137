#!/bin/bash
# Golden per-step losses: one process trains the built-in model for 20 steps on the
# built-in shapes data, in float64 and float32, and its per-step losses must equal
# the ones stored here — exactly (bit for bit) in float64, within rtol 1e-5 in float32.
# The equivalence tests compare every mesh with one process; this pins the one process
# itself, so a change that moves every mesh alike (a constant, an init, a kernel) fails.
#
# Usage: golden_losses.sh BUILD_DIR SOURCE_DIR [--update]
#   --update  rewrite tests/golden/*.jsonl from this build (after an intended change of
#             the numerics; say why in the commit).
#
# Bit-exact float64 needs the same kernels and the same summation order wherever it
# runs: one thread (ATen splits reductions over threads), ATen's AVX2 kernels (AVX-512
# ones sum in another order) and MKL's AVX2 code path (MKL_CBWR; it picks per CPU otherwise).
# Any x86-64 CPU with AVX2 then computes the same bits (checked: identical over repeated
# runs; the files were written on the 2-core build machine).
set -u
build=$1
src=$2
update=${3:-}
mmsp=$build/mmsp
golden=$src/tests/golden
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2
steps=20
failures=0
# A CPU without AVX2 and FMA runs other kernels (and glibc other exp/log): bit-exact
# fp64 cannot hold there, so it is compared at 1e-12 instead, saying so.
# Nor does it hold between CPUs of other models, although ATen and MKL are held to AVX2
# above: an AMD EPYC with AVX2 and FMA but no AVX-512 gave losses 1-2 ulp off from step 2
# on (2026-11-28), and an AMD EPYC Zen 4 (family 25, model 17) with AVX-512 1 ulp off at
# step 16 (2026-12-02, this machine and CI's alike) from the files another CPU with
# AVX-512F had written, with the binary from before that day's changes as with them. So
# written_on.txt names the CPU that wrote the files (vendor, family, model, as
# /proc/cpuinfo gives them; --update rewrites it) and only that CPU compares bit for bit;
# any other compares at 1e-12, saying so. A change of the numerics moves the losses far
# more (a new summation order in the loss: 4e-16 on the same CPU, caught; a wrong mask or
# scale: 1e-3).
written_on=$(cat "$golden/written_on.txt" 2>/dev/null)
cpu_id() {
  awk -F': *' '/^vendor_id/ {v = $2} /^cpu family/ {f = $2} /^model[ \t]*:/ {m = $2} END {print v, f, m}' /proc/cpuinfo
}
fp64_rel=0
if ! grep -qw avx2 /proc/cpuinfo || ! grep -qw fma /proc/cpuinfo; then
  fp64_rel=1e-12
  echo "golden losses: this CPU lacks AVX2 or FMA; float64 compared at rtol 1e-12, not bit for bit"
elif [ "$(cpu_id)" != "$written_on" ]; then
  fp64_rel=1e-12
  echo "golden losses: this CPU ($(cpu_id)) is not the one that wrote the files ($written_on); float64 compared at rtol 1e-12, not bit for bit"
fi
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# name=--model. Only the built-in model: the configs/tiny-*.json keep the released
# 151936-token vocabulary, and one process spends 2-50 s per step on them (measured:
# Qwen2-VL 16 s, Qwen3.5 47 s, LLaVA 2.5 s in fp64 on the 2-core machine), far beyond this
# test's budget; the built-in model takes 0.2 s. Another entry: "NAME=MODEL" below and
# --update.
models=("shapes-qwen2-vl=shapes-qwen2-vl")

# run NAME MODEL DTYPE: $steps steps, one process; writes $work/NAME-DTYPE.jsonl as {"step","loss"} lines
# (the loss as metrics.jsonl prints it: the shortest decimal that reads back to the same double).
run() {
  local out=$work/$1-$3
  if ! $mmsp train --model "$2" --dtype "$3" --steps $steps --tokens-per-rank 256 --warmup 2 --seed 0 \
       --quiet --out "$out" > "$out.log" 2>&1; then
    fail "$1 $3: training failed: $(tail -3 "$out.log")"
    return
  fi
  sed -E 's/.*("loss":[^,}]*).*("step":[0-9]+).*/{\2,\1}/' "$out/metrics.jsonl" > "$out.jsonl"
}

for entry in "${models[@]}"; do
  name=${entry%%=*} model=${entry#*=}
  for dtype in float64 float32; do
    run "$name" "$model" "$dtype" &
    [ "$(jobs -rp | wc -l)" -ge 2 ] && wait -n
  done
done
wait

for entry in "${models[@]}"; do
  name=${entry%%=*}
  for dtype in float64 float32; do
    got=$work/$name-$dtype.jsonl want=$golden/$name-$dtype.jsonl
    [ -s "$got" ] || { fail "$name $dtype: no losses"; continue; }
    [ "$(wc -l < "$got")" = $steps ] || { fail "$name $dtype: $(wc -l < "$got") steps, not $steps"; continue; }
    if [ "$update" = --update ]; then
      cp "$got" "$want" && echo "wrote $want"
      cpu_id > "$golden/written_on.txt"
      continue
    fi
    [ -f "$want" ] || { fail "$want is missing (run with --update)"; continue; }
    [ "$(wc -l < "$want")" = $steps ] || { fail "$want does not hold $steps steps"; continue; }
    if [ $dtype = float64 ]; then max_rel=$fp64_rel; else max_rel=1e-5; fi
    if ! $mmsp compare-losses "$got" "$want" --max-rel $max_rel > "$work/cmp.log" 2>&1; then
      fail "$name $dtype against $want (--max-rel $max_rel): $(cat "$work/cmp.log")"
    fi
  done
done
[ $failures = 0 ] && [ "$update" != --update ] && echo "golden losses: every model and dtype as stored"
exit $((failures > 0))
