#!/bin/bash
# `mmsp compare-losses A B --max-rel X` as a check that can fail: on the metrics of a real
# 3-step run it exits 0 against an exact copy, 1 against a copy with one loss doctored by
# 1e-3 (relative) when X is below that, naming the step, 0 when X is above it; a missing
# file, a malformed line or a bad X is a user error (exit 2).
# Usage: compare_losses.sh BUILD_DIR
set -u
mmsp=$1/mmsp
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# expect STATUS PATTERN ARGS...: `mmsp compare-losses ARGS` exits STATUS and prints PATTERN.
expect() {
  local status=$1 pattern=$2
  shift 2
  $mmsp compare-losses "$@" > "$work/out" 2>&1
  local got=$?
  [ $got -eq "$status" ] || fail "compare-losses $*: exit $got, not $status: $(cat "$work/out")"
  grep -q -- "$pattern" "$work/out" || fail "compare-losses $*: no /$pattern/ in: $(cat "$work/out")"
}

$mmsp train --steps 3 --tokens-per-rank 128 --quiet --out "$work/run" > "$work/train.log" 2>&1 ||
  { echo "FAIL: the 3-step run: $(tail -5 "$work/train.log")"; exit 1; }
a=$work/run/metrics.jsonl
[ "$(grep -c '"loss"' "$a")" = 3 ] || { echo "FAIL: $a does not hold 3 losses: $(cat "$a")"; exit 1; }
cp "$a" "$work/same.jsonl"
# Step 2's loss times (1 + 1e-3), everything else unchanged.
awk '/"step":2[,}]/ { match($0, /"loss":[-0-9.eE+]+/); v = substr($0, RSTART + 7, RLENGTH - 7);
       $0 = substr($0, 1, RSTART + 6) sprintf("%.17g", v * 1.001) substr($0, RSTART + RLENGTH) } { print }' \
  "$a" > "$work/doctored.jsonl"
cmp -s "$a" "$work/doctored.jsonl" && fail "the doctored file equals the original (awk found no step 2 loss)"

expect 0 "3 common steps, largest relative difference 0 " "$a" "$work/same.jsonl" --max-rel 0
expect 0 "largest relative difference 0.001 (step 2)" "$work/doctored.jsonl" "$a"              # no threshold: report only
expect 1 "FAILED: step 2 differs by 0.001 (relative), more than --max-rel 0.0001" "$work/doctored.jsonl" "$a" --max-rel 1e-4
expect 0 "(step 2)" "$work/doctored.jsonl" "$a" --max-rel 1e-2
expect 2 "cannot read metrics file $work/missing.jsonl" "$a" "$work/missing.jsonl" --max-rel 1e-4
echo 'not json' > "$work/bad.jsonl"
expect 2 "bad.jsonl:1: not a metrics line" "$a" "$work/bad.jsonl"
expect 2 "--max-rel -1 must be a finite number >= 0" "$a" "$work/same.jsonl" --max-rel -1
expect 2 "--max-rel nan must be a finite number >= 0" "$a" "$work/same.jsonl" --max-rel nan

[ $failures = 0 ] && echo "compare-losses: all checks passed"
exit $((failures > 0))
