#!/usr/bin/env bash
# ctest's fuzz.smoke: builds the libFuzzer targets (tests/fuzz/CMakeLists.txt) with clang++
# against <build>'s installed package and fuzzes each for a bounded time from its seeds.
#   tests/fuzz/run.sh <build-dir> <source-dir> [fuzz-dir (default <build-dir>/fuzz)]
# MMSP_FUZZ_SECONDS: seconds per target (default 10). MMSP_FUZZ_TARGETS: which ones
# (default all). MMSP_FUZZ_JOBS: parallel compiles (default 2). MMSP_FUZZ_CXX: the clang++.
# Fails when any target crashes, leaks, times out on one input or reports to a
# sanitizer; the input that did it is kept under <fuzz-dir>/artifacts/<target>/ (until the
# next run of that target).
set -euo pipefail
build=$(cd "$1" && pwd) src=$(cd "$2" && pwd)
fuzz=${3:-$build/fuzz}
seconds=${MMSP_FUZZ_SECONDS:-10}
targets=${MMSP_FUZZ_TARGETS:-fuzz_safetensors fuzz_hf_index fuzz_model_config fuzz_batch_json fuzz_train_state fuzz_jsonl_line}
mkdir -p "$fuzz"
fuzz=$(cd "$fuzz" && pwd)

# The package, as a consumer sees it; Torch_DIR is the one <build> was configured with.
start=$SECONDS
cmake --install "$build" --prefix "$fuzz/prefix" > /dev/null
torch_dir=$(sed -n 's/^Torch_DIR:[A-Z]*=//p' "$build/CMakeCache.txt")
cmake -S "$src/tests/fuzz" -B "$fuzz/build" -G Ninja -DCMAKE_BUILD_TYPE= -DCMAKE_CXX_COMPILER="${MMSP_FUZZ_CXX:-clang++}" \
      -DCMAKE_PREFIX_PATH="$fuzz/prefix" -DMMSP_SOURCE_DIR="$src" ${torch_dir:+-DTorch_DIR="$torch_dir"} \
      > "$fuzz/configure.log" 2>&1 || { cat "$fuzz/configure.log"; exit 1; }
cmake --build "$fuzz/build" -- -j "${MMSP_FUZZ_JOBS:-2}" > "$fuzz/build.log" 2>&1 || { cat "$fuzz/build.log"; exit 1; }
echo "fuzz: configured and built in $((SECONDS - start)) s"

# Seeds: the committed ones (tests/fuzz/corpus/<target>) and inputs the repository already
# has, copied to a scratch corpus, because libFuzzer adds the inputs it finds to it.
seed() {  # seed <target> <corpus-dir>
  case $1 in
    fuzz_model_config) cp "$src"/configs/*.json "$src"/configs/hf/*.json "$2"/ ;;
    fuzz_batch_json) cp "$src"/examples/batch-*.json "$2"/ ;;
    fuzz_jsonl_line) split -l 1 "$src/examples/data/data.jsonl" "$2/data-line-" ;;
  esac
  if [ -d "$src/tests/fuzz/corpus/$1" ]; then cp "$src/tests/fuzz/corpus/$1"/* "$2"/; fi
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# the harnesses' own scratch folders (shards, images) go there too
mkdir "$work/tmp"
export TMPDIR=$work/tmp
# halt_on_error: UBSan's reports end the run (the build's -fno-sanitize-recover says so too).
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=""
for t in $targets; do
  # artifacts/<target> holds this run's finding only, so the one named below is this run's
  rm -rf "$fuzz/artifacts/$t"
  mkdir -p "$work/$t" "$fuzz/artifacts/$t"
  seed "$t" "$work/$t"
  # -timeout: one input running 20 s is a hang; -rss_limit_mb: LibTorch's libraries
  # alone take ~700 MB, so 2.5 GB means the input made the parser allocate beyond reason.
  if "$fuzz/build/$t" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2560 -print_final_stats=1 \
       -artifact_prefix="$fuzz/artifacts/$t/" "$work/$t" > "$work/$t.log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$t.log")
    echo "fuzz: $t: ${runs:-?} inputs in ${seconds} s, no finding"
  else
    failed="$failed $t"
    tail -n 60 "$work/$t.log"
    echo "fuzz: $t FAILED; the input: $(ls "$fuzz/artifacts/$t"/* 2>/dev/null | tr '\n' ' ')"
    echo "      reproduce: $fuzz/build/$t <that file>"
  fi
done
echo "fuzz: all in $((SECONDS - start)) s"
[ -z "$failed" ] || { echo "fuzz: findings in:$failed"; exit 1; }
