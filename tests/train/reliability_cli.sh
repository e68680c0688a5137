#!/bin/bash
# Reliability of `mmsp train` with real ranks (docs/reliability.md):
#  1. a SIGSTOPped rank of a 4-rank job is named on every rank and the job ends within
#     --heartbeat-timeout (3 s) + 5 s, under mmsp-run and with ranks started by hand;
#     no process is left;
#     a rank starved (stopped) while the others end on the hang still names rank 2;
#  2. a rank that computes longer than the heartbeat timeout inside a step is not killed;
#  3. a rank given another batch is named within 2 s, before the step's first collective;
#  4. a flipped bit in a checkpoint makes --resume refuse it, naming the file;
#  5. `mmsp plan` refuses bad token ids, vocab sizes and duplicate keys; a config only the
#     model refuses (mrope_section against head_dim) plans, and `mmsp train` refuses it.
# Usage: reliability_cli.sh BUILD_DIR SOURCE_DIR
set -u
build=$1
src=$2
mmsp=$build/mmsp
work=$(mktemp -d)
pids_to_kill=()
cleanup() {
  for p in "${pids_to_kill[@]}"; do kill -KILL "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
stamp() { while IFS= read -r line; do printf '%s %s\n' "$(date +%s.%N)" "$line"; done; }
# seconds between the first line matching $2 and the first matching $3 in stamped log $1
between() {
  local a b
  a=$(grep -m1 -- "$2" "$1" | cut -d' ' -f1)
  b=$(grep -m1 -- "$3" "$1" | cut -d' ' -f1)
  [ -n "$a" ] && [ -n "$b" ] && awk "BEGIN { printf \"%.2f\", $b - $a }" || echo 999
}
lt() { awk "BEGIN { exit !($1 < $2) }"; }
train=(train --ring 2 --ulysses 2 --tokens-per-rank 64 --attention-block 32 --warmup 1 --heartbeat-timeout 3)
rank_pid() {  # rank_pid LAUNCHER_PID RANK: the rank's pid among the launcher's children
  for p in $(ps -o pid= --ppid "$1"); do
    tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "RANK=$2" && { echo $p; return; }
  done
}
alive() {  # alive PID: still an mmsp process (not a reused pid)
  { tr '\0' ' ' < /proc/$1/cmdline; } 2>/dev/null | grep -q "mmsp train"
}
wait_for() {  # wait_for FILE PATTERN SECONDS
  for ((i = 0; i < $3 * 10; i++)); do grep -q -- "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  return 1
}

# start_by_hand NAME WHAT: 4 ranks with torchrun's variables and no launcher, logs
# $work/NAME.R.log, pids in `pids`; returns once rank 0 has logged step 2.
start_by_hand() {
  local port r
  port=$("$build/mmsp-run" -n 1 --no-prefix -- sh -c 'echo $MASTER_PORT')
  pids=()
  for r in 0 1 2 3; do
    env RANK=$r WORLD_SIZE=4 LOCAL_RANK=$r LOCAL_WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      $mmsp "${train[@]}" --steps 100000 > "$work/$1.$r.log" 2>&1 &
    pids+=($!)
  done
  pids_to_kill+=("${pids[@]}")
  wait_for "$work/$1.0.log" "step 2 |" 120 || fail "$2: no step 2: $(tail -5 "$work/$1.0.log")"
}

# --- 1a. SIGSTOP under mmsp-run ---------------------------------------------------------
$build/mmsp-run -n 4 --grace 1 --kill-after 1 -- $mmsp "${train[@]}" --steps 100000 > >(stamp > "$work/stop.log") 2>&1 &
launcher=$!
wait_for "$work/stop.log" "step 2 |" 120 || fail "stop: the job did not reach step 2: $(tail -5 "$work/stop.log")"
victim=$(rank_pid "$launcher" 2)
all=$(ps -o pid= --ppid "$launcher")
[ -n "$victim" ] || fail "stop: no rank 2 process under mmsp-run $launcher"
pids_to_kill+=($victim)
t0=$(date +%s.%N)
kill -STOP "$victim"
wait $launcher
secs=$(awk "BEGIN { printf \"%.2f\", $(date +%s.%N) - $t0 }")
sleep 0.5  # the last lines through the stamping reader
echo "mmsp-run, 4 ranks, rank 2 stopped: job over after $secs s (heartbeat timeout 3 s)"
lt "$secs" 8 || fail "stop: the job took $secs s after the stop (limit 3 + 5)"
grep -q "mmsp: error: rank 2 has not answered for .* s (last seen in step [0-9]*, phase " "$work/stop.log" \
  || fail "stop: no rank named rank 2: $(tail -8 "$work/stop.log")"
# Each said so (its watcher, or its main thread when a collective failed first because a
# peer had ended and the store with rank 0: on a loaded machine that can come before the
# watcher's next read), or was slower than the launcher's --grace and stopped by it.
for r in 0 1 3; do
  grep -q "\[rank $r\] mmsp\( train\)\?: error: rank 2 has not answered" "$work/stop.log" \
    || grep -q "summary: rank $r killed by signal 15 (Terminated) (stopped by mmsp-run)" "$work/stop.log" \
    || fail "stop: rank $r did not name rank 2: $(grep -v '\] step [0-9]* |\|frame #' "$work/stop.log" | tail -20)"
done
for p in $all; do alive "$p" && fail "stop: process $p is still there"; done

# --- 1b. SIGSTOP without a launcher (torchrun's variables, one log per rank) --------------
start_by_hand hand "by hand"
kill -STOP "${pids[2]}"
t0=$(date +%s.%N)
for r in 0 1 3; do
  for ((i = 0; i < 300; i++)); do kill -0 "${pids[$r]}" 2>/dev/null || break; sleep 0.05; done
done
secs=$(awk "BEGIN { printf \"%.2f\", $(date +%s.%N) - $t0 }")
echo "no launcher, 4 ranks, rank 2 stopped: the other ranks exited after $secs s"
lt "$secs" 8 || fail "by hand: the ranks took $secs s after the stop (limit 3 + 5)"
for r in 0 1 3; do
  wait "${pids[$r]}"
  status=$?
  [ $status != 0 ] || fail "by hand: rank $r exited 0"
  grep -q "rank 2 has not answered for" "$work/hand.$r.log" || fail "by hand: rank $r: $(tail -3 "$work/hand.$r.log")"
done
kill -KILL "${pids[2]}"
wait "${pids[2]}" 2>/dev/null
for p in "${pids[@]}"; do alive "$p" && fail "by hand: process $p is still there"; done

# --- 1c. a starved rank learns the verdict after the others (and the store) have gone ------
# Rank 1 is stopped 2.5 s after rank 2, for 3 s: ranks 0 and 3 declare rank 2 hung, wait
# 2 s for rank 1 to read it, and end, taking the store with rank 0. Rank 1 then finds the
# store gone: it must still name rank 2 (silent before the store went), not rank 0.
start_by_hand starved starved
kill -STOP "${pids[2]}"
sleep 2.5
kill -STOP "${pids[1]}"
sleep 3
kill -CONT "${pids[1]}"
for ((i = 0; i < 200; i++)); do kill -0 "${pids[1]}" 2>/dev/null || break; sleep 0.05; done
for r in 0 1 3; do
  wait "${pids[$r]}"
  [ $? != 0 ] || fail "starved: rank $r exited 0"
  grep -q "rank 2 has not answered for" "$work/starved.$r.log" \
    || fail "starved: rank $r did not name rank 2: $(grep -v '^  \|step [0-9]* |\|frame #' "$work/starved.$r.log" | tail -4)"
done
echo "a rank starved for 3 s while the others ended on rank 2: named rank 2 ($(grep -c "then the job's store" "$work/starved.1.log") line(s) say the store went after)"
kill -KILL "${pids[2]}"
wait "${pids[2]}" 2>/dev/null

# --- 2. a long step is not a hang ---------------------------------------------------------
$build/mmsp-run -n 4 -- $mmsp "${train[@]}" --steps 3 --test-sleep-in-step 1:2:6 > "$work/slow.log" 2>&1 \
  || fail "slow: a rank computing 6 s (heartbeat timeout 3 s) ended the job: $(tail -5 "$work/slow.log")"
grep -q "has not answered" "$work/slow.log" && fail "slow: a heartbeat failure was reported"

# --- 3. a rank with another batch is named before it hangs -------------------------------
$build/mmsp-run -n 4 -- $mmsp "${train[@]}" --steps 5 --test-skew-batch 2:3 2>&1 | stamp > "$work/skew.log"
for r in 0 1 2 3; do
  grep -q "\[rank $r\] mmsp train: error: step 3: rank 2 is about to run another step than ranks 0, 1, 3 (first difference: samples)" \
    "$work/skew.log" || fail "skew: rank $r did not name rank 2: $(tail -6 "$work/skew.log")"
done
secs=$(between "$work/skew.log" "step 2 |" "is about to run another step")
echo "4 ranks, rank 2 given another batch in step 3: named $secs s after step 2's line"
lt "$secs" 2 || fail "skew: named after $secs s (limit 2)"

# --- 4. a flipped bit in a checkpoint: --resume refuses it, naming the file ---------------
short=(train --tokens-per-rank 64 --attention-block 32 --warmup 1 --quiet)
$build/mmsp-run -n 2 -- $mmsp "${short[@]}" --steps 2 --out "$work/ckpt" > "$work/ckpt.log" 2>&1 || fail "save: $(tail -3 "$work/ckpt.log")"
step=$work/ckpt/step-000002
flip() {  # flip FILE BYTE: xor one bit of one byte (python3: a Debian package `make` installs)
  python3 -c "import sys; f=open(sys.argv[1],'r+b'); n=int(sys.argv[2]); f.seek(n); b=f.read(1); f.seek(n); f.write(bytes([b[0]^4]))" "$1" "$2"
}
for target in hf/model.safetensors:100 hf/model.safetensors:-50 optimizer.safetensors:-9 state.json:30 hf/config.json:12; do
  file=${target%%:*} at=${target#*:}
  size=$(stat -c %s "$step/$file")
  [ "$at" -lt 0 ] && at=$((size + at))
  cp "$step/$file" "$work/orig"
  flip "$step/$file" "$at"
  $build/mmsp-run -n 2 -- $mmsp "${short[@]}" --steps 3 --resume "$work/ckpt" > "$work/resume.log" 2>&1
  status=$?
  [ $status = 2 ] || fail "resume with a bit flipped in $file at $at: exit $status"
  for r in 0 1; do
    grep -q "\[rank $r\] mmsp train: error: .*$step/$file: checksum mismatch" "$work/resume.log" \
      || fail "resume, $file: rank $r did not name the file: $(tail -3 "$work/resume.log")"
  done
  cp "$work/orig" "$step/$file"
done
# One step more than the saved run: --steps is a flag that changes the schedule, which
# --resume refuses unless told.
$build/mmsp-run -n 2 -- $mmsp "${short[@]}" --steps 3 --allow-changed-flags --resume "$work/ckpt" > "$work/resume.log" 2>&1 \
  || fail "resume of the repaired checkpoint: $(tail -3 "$work/resume.log")"

# --- 5. mmsp plan checks what planning uses; mmsp train checks the model --------------------
cfg=$src/configs/tiny-qwen2-vl.json
batch=$src/examples/batch-qwen2-vl.json
plan_refuses() {  # plan_refuses NAME PATTERN CONFIG BATCH
  $mmsp plan --config "$3" --batch "$4" > "$work/$1.log" 2>&1
  local status=$?
  [ $status = 2 ] || fail "plan $1: exit $status, not 2: $(tail -2 "$work/$1.log")"
  grep -q -- "$2" "$work/$1.log" || fail "plan $1: no /$2/: $(tail -2 "$work/$1.log")"
}
# mrope_section against head_dim / 2 is the model's rule (the planner knows no head size):
# plan plans, train refuses before anything is built.
sed 's/"mrope_section": \[2, 3, 3\]/"mrope_section": [2, 3, 4]/' "$cfg" > "$work/mrope.json"
$mmsp plan --config "$work/mrope.json" --batch "$batch" > "$work/mrope-plan.log" 2>&1 ||
  fail "plan mrope: exit $?, not 0: $(tail -2 "$work/mrope-plan.log")"
$mmsp train --model "$work/mrope.json" --steps 1 --quiet > "$work/mrope-train.log" 2>&1
status=$?
[ $status = 2 ] || fail "train mrope: exit $status, not 2: $(tail -2 "$work/mrope-train.log")"
grep -q "mrope_section \[2, 3, 4\] sums to 9 but must be head_dim / 2 = 16 / 2" "$work/mrope-train.log" ||
  fail "train mrope: no message: $(tail -2 "$work/mrope-train.log")"
sed 's/"vocab_size": 151936/"vocab_size": -1/' "$cfg" > "$work/vocab.json"
plan_refuses vocab "vocab_size" "$work/vocab.json" "$batch"
sed 's/"input_ids": \[/"input_ids": [151936, /' "$batch" > "$work/ids.json"
plan_refuses ids "input_ids\[0\] = 151936 is outside the vocabulary 0..151935 of " "$cfg" "$work/ids.json"
sed 's/"vocab_size": 151936/"vocab_size": 151936, "vocab_size": 151936/' "$cfg" > "$work/dup.json"
plan_refuses dup 'the key "vocab_size" appears twice' "$work/dup.json" "$batch"

if [ $failures -ne 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "reliability_cli: all checks passed"
