#!/bin/bash
# Start-up, orphans and job identity with real processes (docs/launcher.md#start-up-and-job-identity):
#  1. a rank that never starts: the others end within --timeout + 5 s (+ 5 s for a loaded
#     machine, counted from their launch), exit 2, naming it;
#  2. mmsp-run killed by SIGKILL during a --quiet train: every rank is gone within 5 s;
#  3. two jobs on one MASTER_PORT: each ends 0 or with a clear error, never crossed;
#  4. MASTER_PORT held by a process that accepts and never answers: the rank ends within
#     --timeout + 5 s, exit 2, naming what it waited for;
#  5. rank 0 stopped (SIGSTOP) while it serves the rendezvous: ranks 1-3 end within
#     --timeout + 5 s, exit 2; rank 0, continued later, ends at once.
# Usage: reliability.sh BUILD_DIR
set -u
build=$1
mmsp=$build/mmsp
mmsp_run=$build/mmsp-run
work=$(mktemp -d)
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
now() { date +%s.%N; }
elapsed() { echo "$(now) - $1" | bc; }
free_port() { "$mmsp_run" -n 1 --no-prefix -- sh -c 'echo $MASTER_PORT'; }
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$work"; }
trap cleanup EXIT

# Starts rank R of N by hand (torchrun's variables) in the background: start_rank TAG PORT R N ARGS...
start_rank() {
  local tag=$1 port=$2 r=$3 n=$4
  shift 4
  env RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    timeout 60 "$mmsp" "$@" > "$work/$tag.$r.log" 2>&1 &
  pids+=($!)
}

# --- 1. one rank of 4 never starts (rank 3; then rank 0, the store's host) -----------------
timeout_s=5
for missing in 3 0; do
  port=$(free_port)
  start=$(now)
  started=()
  for r in 0 1 2 3; do
    [ $r = $missing ] && continue
    start_rank "missing$missing" "$port" $r 4 selftest --timeout $timeout_s
    started+=("$r:$!")
  done
  for entry in "${started[@]}"; do
    r=${entry%%:*} pid=${entry#*:}
    wait "$pid"
    status=$?
    took=$(elapsed "$start")
    log="$work/missing$missing.$r.log"
    echo "missing rank $missing: rank $r exited $status after ${took} s: $(tail -1 "$log")"
    [ $status = 2 ] || fail "missing rank $missing: rank $r exited $status, not 2: $(tail -3 "$log")"
    grep -q "rank $missing did not join within $timeout_s s" "$log" ||
      fail "missing rank $missing: rank $r did not name it: $(tail -3 "$log")"
    grep -q "c10::\|frame #" "$log" && fail "missing rank $missing: rank $r printed a backtrace"
    # The bound asked of start-up is --timeout + 5 s; 5 s more for starting LibTorch on a loaded 2-core machine.
    [ "$(echo "$took < $timeout_s + 10" | bc)" = 1 ] || fail "missing rank $missing: rank $r took $took s"
  done
done

# --- 2. mmsp-run killed by SIGKILL while its ranks train quietly ----------------------------
"$mmsp_run" -n 2 -- "$mmsp" train --quiet --steps 100000 --tokens-per-rank 128 --attention-block 32 \
  > "$work/orphans.log" 2>&1 &
launcher=$!
pids+=($launcher)
ranks=""
for _ in $(seq 100); do  # until both ranks run mmsp
  ranks=$(pgrep -P $launcher -x mmsp | tr '\n' ' ')
  [ "$(echo $ranks | wc -w)" = 2 ] && break
  sleep 0.1
done
[ "$(echo $ranks | wc -w)" = 2 ] || fail "orphans: the 2 ranks did not start: $(cat "$work/orphans.log")"
sleep 3  # into training
kill -9 $launcher
start=$(now)
for _ in $(seq 100); do
  alive=0
  for p in $ranks; do kill -0 "$p" 2>/dev/null && alive=1; done
  [ $alive = 0 ] && break
  sleep 0.1
done
took=$(elapsed "$start")
echo "orphans: ranks gone ${took} s after mmsp-run's SIGKILL (alive: $alive)"
[ $alive = 0 ] || fail "orphans: ranks $ranks still run 10 s after mmsp-run was killed"
[ "$(echo "$took < 5" | bc)" = 1 ] || fail "orphans: ranks took $took s to end"

# --- 3. two jobs on one MASTER_PORT ---------------------------------------------------------
check_job() {  # check_job NAME STATUS LOG
  local name=$1 status=$2 log=$3
  case $status in
    0) grep -q "passed" "$log" || fail "$name exited 0 without passing: $(tail -3 "$log")" ;;
    2) grep -Eq "reached the rendezvous of run|could not serve the rendezvous|a second time" "$log" ||
         fail "$name: exit 2 without a clear rendezvous error: $(tail -4 "$log")" ;;
    *) fail "$name exited $status: $(tail -6 "$log")" ;;
  esac
}
# (a) two mmsp-run jobs (each exports its own MMSP_RUN_ID)
for round in 1 2 3; do
  port=$(free_port)
  start=$(now)
  "$mmsp_run" -n 2 --master-port "$port" -- "$mmsp" selftest --timeout 20 > "$work/a$round.log" 2>&1 &
  a=$!
  "$mmsp_run" -n 2 --master-port "$port" -- "$mmsp" selftest --timeout 20 > "$work/b$round.log" 2>&1 &
  b=$!
  pids+=($a $b)
  wait $a; sa=$?
  wait $b; sb=$?
  echo "two jobs on port $port, round $round: exit $sa and $sb after $(elapsed "$start") s"
  check_job "round $round job A" $sa "$work/a$round.log"
  check_job "round $round job B" $sb "$work/b$round.log"
  [ $sa = 0 ] || [ $sb = 0 ] || fail "round $round: neither job ran"
done
# (b) ranks started by hand with their own MMSP_RUN_ID: rank 1 of job B meets job A's store
port=$(free_port)
MMSP_RUN_ID=job-A start_rank jobA "$port" 0 2 selftest --timeout 10
a0=$!
sleep 1
MMSP_RUN_ID=job-B start_rank jobB "$port" 1 2 selftest --timeout 10
b1=$!
wait $b1; sb=$?
[ $sb = 2 ] || fail "job B's rank 1 exited $sb, not 2"
grep -q "rank 1 of run 'job-B' reached the rendezvous of run 'job-A'" "$work/jobB.1.log" ||
  fail "job B's rank 1 did not name the other run: $(tail -3 "$work/jobB.1.log")"
kill $a0 2>/dev/null; wait $a0 2>/dev/null

# --- 4. a silent listener on MASTER_PORT ------------------------------------------------
port=$(free_port)
python3 -c "import socket,time,sys; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(8); time.sleep(60)" "$port" &
listener=$!
pids+=($listener)
sleep 0.5
start=$(now)
start_rank silent "$port" 1 2 train --ring 2 --steps 2 --timeout $timeout_s
wait $!
status=$?
took=$(elapsed "$start")
echo "silent listener: rank 1 exited $status after $took s: $(tail -1 "$work/silent.1.log")"
[ $status = 2 ] || fail "silent listener: exit $status, not 2: $(tail -2 "$work/silent.1.log")"
grep -q "rank 0 did not join within $timeout_s s: rank 1 is still connecting to rank 0's store at 127.0.0.1:$port" \
  "$work/silent.1.log" || fail "silent listener: no clear message: $(tail -2 "$work/silent.1.log")"
[ "$(echo "$took < $timeout_s + 5 + 5" | bc)" = 1 ] || fail "silent listener: took $took s"
kill $listener 2>/dev/null

# --- 5. rank 0 stopped while serving the rendezvous ------------------------------------
port=$(free_port)
start_rank stopped0 "$port" 0 4 selftest --timeout $timeout_s
rank0=$!
for _ in $(seq 100); do  # until rank 0 listens
  (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break
  sleep 0.1
done
rank0_mmsp=$(pgrep -P $rank0 -x mmsp)  # start_rank runs it under timeout(1)
[ -n "$rank0_mmsp" ] || fail "rank 0 stopped: no mmsp process under $rank0"
kill -STOP $rank0_mmsp
start=$(now)
started=()
for r in 1 2 3; do
  start_rank stopped0 "$port" $r 4 selftest --timeout $timeout_s
  started+=("$r:$!")
done
for entry in "${started[@]}"; do
  r=${entry%%:*} pid=${entry#*:}
  wait "$pid"
  status=$?
  took=$(elapsed "$start")
  log="$work/stopped0.$r.log"
  echo "rank 0 stopped: rank $r exited $status after $took s: $(tail -1 "$log")"
  [ $status = 2 ] || fail "rank 0 stopped: rank $r exited $status: $(tail -2 "$log")"
  grep -q "rank 0 did not join within $timeout_s s" "$log" ||
    fail "rank 0 stopped: rank $r gave no clear message: $(tail -2 "$log")"
  [ "$(echo "$took < $timeout_s + 5 + 5" | bc)" = 1 ] || fail "rank 0 stopped: rank $r took $took s"
done
kill -CONT $rank0_mmsp
start=$(now)
wait $rank0
status=$?
echo "rank 0 continued: exited $status after $(elapsed "$start") s: $(tail -1 "$work/stopped0.0.log")"
[ $status = 2 ] || fail "rank 0, continued, exited $status: $(tail -2 "$work/stopped0.0.log")"
[ "$(echo "$(elapsed "$start") < 5" | bc)" = 1 ] || fail "rank 0, continued, took $(elapsed "$start") s"

if [ $failures -ne 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "reliability: all checks passed"
