#!/bin/bash
# The prepared GPU check (docs/gpu.md): on a bare GPU machine (no network; PyTorch with
# CUDA, CMake, ninja and g++ on the image; the rest carried by scripts/gpu-carry.sh), build
# mmsp against the image's LibTorch, run the `gpu` tests and the GPU benchmarks, and write
# every figure to one JSON. Each stage has its own time limit; the whole stays under 8 min.
#
#   scripts/gpu-check.sh [--dry-run] [--out DIR] [--build DIR]
#
# --dry-run: on a machine without a GPU, the same stages on the CPU (the gpu tests skip,
# the benchmarks run small shapes on --device cpu): proves the script, not the GPU.
# Without --dry-run and without a GPU it stops at once, saying so. Logs and gpu-check.json
# go to --out (default $OUT, else ./gpu-check-out). --build DIR: an existing, configured
# build tree to use instead of configuring ./build-gpu-check (a dry run beside a dev tree).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
dry=0
given_build=
out=${OUT:-$root/gpu-check-out}
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) dry=1 ;;
    --out) out=$2; shift ;;
    --build) given_build=$2; shift ;;
    *) echo "gpu-check: unknown argument '$1' (--dry-run, --out DIR, --build DIR)" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$out"
log=$out/gpu-check.log
: > "$log"
say() { echo "gpu-check: $*" | tee -a "$log"; }
started=$(date +%s)
elapsed() { echo $(( $(date +%s) - started )); }
status=()  # "stage:result"
finish() {
  local json=$out/gpu-check.json
  "$PYTHON" - "$out" "$dry" "$(elapsed)" "${status[@]}" <<'PY' || say "could not write the JSON"
import json, os, sys, glob
out, dry, seconds, stages = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), sys.argv[4:]
result = {"dry_run": dry, "seconds": seconds, "stages": dict(s.split(":", 1) for s in stages)}
for path in sorted(glob.glob(os.path.join(out, "*.bench.json"))):
    try:
        result[os.path.basename(path)[:-len(".bench.json")]] = json.load(open(path))
    except Exception as e:
        result[os.path.basename(path)] = {"error": str(e)}
for path in sorted(glob.glob(os.path.join(out, "device.txt"))):
    result["device"] = open(path).read().strip()
json.dump(result, open(os.path.join(out, "gpu-check.json"), "w"), indent=2)
print(json.dumps(result["stages"]))
PY
  say "done in $(elapsed) s: $out/gpu-check.json"
}
budget=${GPU_CHECK_BUDGET:-470}  # seconds for everything: the 8 minutes, less the JSON
stage() {  # stage <name> <seconds> <command...>: runs it under its limit, logs, records
  local name=$1 limit=$2; shift 2
  local left=$(( budget - $(elapsed) ))
  if [ $left -lt 15 ]; then
    status+=("$name:skipped (out of the ${budget} s budget)")
    say "stage $name skipped: out of time"
    return 1
  fi
  [ $limit -gt $left ] && limit=$left
  say "stage $name (limit ${limit} s, at $(elapsed) s)"
  timeout --kill-after=10 "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$out/$name.log" >> "$log"
  if [ $rc -eq 0 ]; then status+=("$name:ok"); else status+=("$name:failed (exit $rc, $out/$name.log)"); fi
  say "stage $name: exit $rc"
  return $rc
}

PYTHON=${PYTHON:-}
if [ -z "$PYTHON" ]; then
  for p in "$root/.venv/bin/python" /opt/torch/.venv/bin/python python3; do
    if "$p" -c 'import torch' 2>/dev/null; then PYTHON=$p; break; fi
  done
fi
[ -n "$PYTHON" ] || { say "no Python with torch found (set PYTHON=...)"; exit 1; }
torch_prefix=$("$PYTHON" -c 'import torch; print(torch.utils.cmake_prefix_path)')
gpus=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
"$PYTHON" -c 'import torch; print(torch.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")' \
  > "$out/device.txt" 2>&1
say "torch $(cat "$out/device.txt"); GPUs: $gpus; python $PYTHON"
if [ "$gpus" = 0 ] && [ $dry = 0 ]; then
  say "no CUDA device here: this is the GPU check; on a CPU machine run it with --dry-run"
  status+=("device:no GPU")
  finish
  exit 1
fi

carry=$root/.gpu-carry
build=${given_build:-$root/build-gpu-check}
prefix="$torch_prefix"
[ -d "$carry/headers/usr" ] && prefix="$prefix;$carry/headers/usr"
cxx_flags=""
[ -d "$carry/headers/usr/include" ] && cxx_flags="-isystem $carry/headers/usr/include"
# libjpeg's jconfig.h sits in the multiarch folder: the carried one, not the machine's.
multiarch=$carry/headers/usr/include/$(gcc -dumpmachine 2>/dev/null || echo x86_64-linux-gnu)
[ -d "$multiarch" ] && cxx_flags="$cxx_flags -isystem $multiarch"
# The machine's gtest/benchmark first, carried ones as a fallback. A command, not a shell
# function: `stage` runs it under timeout(1), which can only start programs.
configure=(cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMMSP_WERROR=OFF
           -DCMAKE_CXX_FLAGS="$cxx_flags" -DMMSP_PYTHON=)  # the gpu tests need no Python
if [ -n "$given_build" ]; then
  [ -f "$build/CMakeCache.txt" ] || { say "--build $build is not a configured build tree"; exit 2; }
  status+=("configure:given $build")
elif ! stage configure 120 "${configure[@]}" -DCMAKE_PREFIX_PATH="$prefix"; then
  rm -rf "$build"
  stage configure-carried 120 "${configure[@]}" -DCMAKE_PREFIX_PATH="$prefix;$carry/gtest/usr;$carry/benchmark/usr" \
    || { finish; exit 1; }
fi
jobs=$(nproc)
stage build 300 cmake --build "$build" -j "$jobs" --target mmsp mmsp-run test_gpu || { finish; exit 1; }

bin=$build
stage gpu-tests 240 ctest --test-dir "$build" -L gpu --output-on-failure
if [ "$gpus" != 0 ]; then
  tokens=(8192 32768); segments=(512 1024 2048 4096 256); dtype=bfloat16; device=cuda
  mem_model=configs/hf/Qwen2-VL-7B-Instruct.json; mem_tokens=32768; mem_layers=4; linear_tokens=8192
else  # dry run: the same code on small shapes
  tokens=(256 512); segments=(64 128 32); dtype=float32; device=cpu
  mem_model=configs/tiny-qwen2-vl.json; mem_tokens=256; mem_layers=0; linear_tokens=512
fi
# Every kernel of the registry that serves the device (cudnn, fused: FlashAttention-2 varlen)
# against the best SDPA backend, at 8k and 32k causal tokens (kernels.*.over_best_sdpa).
stage bench-attention 120 "$bin/mmsp" bench attention --part fused --device $device --dtype $dtype \
  --fused-tokens "${tokens[@]}" --segments "${segments[@]}" --out "$out/attention.bench.json"
# --attention-kernel auto's measured choice: each kernel's probe against the blockwise one
# and its timing, the table and the winner, at the same lengths (16 heads of 128, and GQA 4).
stage bench-choice 90 "$bin/mmsp" bench attention --part choice --device $device --dtype $dtype \
  --fused-tokens "${tokens[@]}" --repeats 3 --out "$out/choice.bench.json"
stage bench-choice-gqa 60 "$bin/mmsp" bench attention --part choice --device $device --dtype $dtype \
  --fused-tokens "${tokens[0]}" --heads 16 --kv-heads 4 --repeats 3 --out "$out/choice-gqa.bench.json"
# The zigzag ring over 2 ranks sharing the GPU (host-staged collectives: the test mode, so
# this is the ring's cost through host memory, not NCCL's), communication overlapped and
# not: seconds, exposed and hidden communication, and ring_fraction_of_ideal (one rank's
# kernel on the whole sequence ÷ 2, over the ring's time).
MMSP_SHARE_GPU=1 stage bench-ring 120 "$bin/mmsp-run" -n 2 -- "$bin/mmsp" bench attention --part ring \
  --device $device --dtype $dtype --fused-tokens "${tokens[0]}" --out "$out/ring.bench.json"
stage bench-linear 60 "$bin/mmsp" bench linear-attention --part kernel --device $device \
  --kernel-tokens $linear_tokens --out "$out/linear.bench.json"
stage bench-step 180 "$bin/mmsp" bench memory --device $device --model $mem_model --layers $mem_layers \
  --tokens-per-rank $mem_tokens --dtype $dtype --shard none --checkpoint-activations decoder --steps 2 \
  --out "$out/step.bench.json"
# The memory layers on the device: --shard parameters with recomputation, then --tiled-mlp
# auto, then --offload-activations (layer inputs to pinned host memory on a side stream):
# the peak each leaves on the GPU against the preflight, and the offload's step time.
stage bench-memory-layers 150 "$bin/mmsp" bench memory --device $device --model $mem_model --layers $mem_layers \
  --tokens-per-rank $mem_tokens --dtype $dtype --shard parameters --checkpoint-activations all --steps 2 \
  --out "$out/memory-layers.bench.json"
# The longest sequence one device holds for Qwen2-VL-7B (the whole model), by the preflight:
# this GPU's memory (dry run: an H100's nominal 80 GB and an H200's 141 GB).
if [ "$gpus" != 0 ]; then
  capacity=$("$PYTHON" -c 'import torch; print(torch.cuda.mem_get_info()[1])')
else
  capacity="80000000000 141000000000"  # the cards' nominal 80 GB and 141 GB
fi
# One GPU cannot hold its training state (8.3 B parameters × 18 bytes), so also per GPU of an
# 8-GPU job with the state sharded (--shard parameters).
stage bench-longest 60 "$bin/mmsp" bench memory --model configs/hf/Qwen2-VL-7B-Instruct.json --dtype bfloat16 \
  --shard none --longest $capacity --out "$out/longest.bench.json"
stage bench-longest-8 60 "$bin/mmsp" bench memory --model configs/hf/Qwen2-VL-7B-Instruct.json --dtype bfloat16 \
  --shard parameters --longest $capacity --longest-ranks 8 --out "$out/longest-8.bench.json"
MMSP_SHARE_GPU=1 stage selftest-shared 60 "$bin/mmsp-run" -n 2 -- "$bin/mmsp" selftest --device $device --ulysses 2
finish
failed=0
for s in "${status[@]}"; do case $s in *failed*) failed=1 ;; esac; done
exit $failed
