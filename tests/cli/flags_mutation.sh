#!/bin/bash
# Every numeric flag of `mmsp train` and `mmsp plan` with bad values (0, -1, huge, nan,
# inf, not a number, 2^63, ...): each case must exit 0 or 2 with a message, never another
# status (no bad_alloc, no CLI11 code, no crash). One process, no ranks: train cases add
# `--out` on a file, so that a value that passes its check still ends at once (exit 2,
# "--out ... is not a directory") instead of training.
# Usage: flags_mutation.sh BUILD_DIR SOURCE_DIR
set -u
mmsp=$1/mmsp
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
touch "$work/a-file"
failures=0 cases=0
values=(0 -1 99999999999999 nan inf abc 9223372036854775808)  # 0, -1, huge, nan, inf, not a number, 2^63

# check NAME ARGS...: status 0 or 2, and a message on 2. Runs in the background, four
# at a time (each case is a LibTorch start-up more than work); failures go to $work/failures.
check() {
  while [ "$(jobs -rp | wc -l)" -ge 4 ]; do wait -n; done
  cases=$((cases + 1))
  local id=$cases
  (
    name=$1
    shift
    timeout 60 "$@" > "$work/$id.out" 2> "$work/$id.err"
    status=$?
    if [ $status != 0 ] && [ $status != 2 ]; then
      echo "FAIL: $name exited $status: $(tail -c 300 "$work/$id.err")" >> "$work/failures"
    elif [ $status = 2 ] && ! grep -q '[a-z]' "$work/$id.err"; then
      echo "FAIL: $name exited 2 without a message" >> "$work/failures"
    fi
    rm -f "$work/$id.out" "$work/$id.err"
  ) &
}

train_flags=(--dp --ring --ulysses --timeout --steps --stop-after --tokens-per-rank --data-rows --lr --min-lr
             --warmup --weight-decay --clip --seed --shapes-samples --attention-block --checkpoint-every --keep
             --max-image-pixels --loss-chunk --tiled-mlp)
for flag in "${train_flags[@]}"; do
  for v in "${values[@]}"; do
    check "mmsp train $flag '$v'" env -u RANK -u WORLD_SIZE "$mmsp" train "$flag" "$v" --out "$work/a-file"
  done
done
cfg=$src/configs/tiny-qwen2-vl.json
batch=$src/examples/batch-qwen2-vl.json
for flag in --dp --ring --ulysses --world --rank --indent; do
  for v in "${values[@]}"; do
    check "mmsp plan $flag '$v'" "$mmsp" plan --config "$cfg" --batch "$batch" "$flag" "$v"
  done
done
wait
[ -f "$work/failures" ] && { cat "$work/failures"; failures=$(wc -l < "$work/failures"); }
# The messages that name the rule (not a CLI11 range of 300 digits).
"$mmsp" train --dp 0 2> "$work/err"
grep -q -- "--dp 0 must be at least 1" "$work/err" || { failures=$((failures + 1)); echo "FAIL: --dp 0: $(cat "$work/err")"; }
"$mmsp" train --timeout nan 2> "$work/err"
grep -q -- "--timeout nan must be a number of seconds in (0, 1e+06]" "$work/err" ||
  { failures=$((failures + 1)); echo "FAIL: --timeout nan: $(cat "$work/err")"; }
"$mmsp" train --shapes-samples 2147483648 2> "$work/err"
grep -q -- "--shapes-samples 2147483648 is too large: at most 10000000" "$work/err" ||
  { failures=$((failures + 1)); echo "FAIL: --shapes-samples: $(cat "$work/err")"; }
"$mmsp" train --tokens-per-rank 100000000 2> "$work/err"
grep -q -- "--tokens-per-rank 100000000 is too large: at most 1048576" "$work/err" ||
  { failures=$((failures + 1)); echo "FAIL: --tokens-per-rank: $(cat "$work/err")"; }

if [ $failures -ne 0 ]; then echo "$failures of $cases case(s) failed"; exit 1; fi
echo "flags_mutation: $cases cases, each exited 0 or 2 with a message"
