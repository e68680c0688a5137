#!/bin/bash
# Two hosts in the suite (docs/launcher.md#two-hosts): two network namespaces joined by a
# veth pair, each with its own address, its own loopback and its own host name (a UTS
# namespace), so that nothing can pass over 127.0.0.1 between them. Jobs are started in
# them as docs/launcher.md tells a user. Cases (one ctest entry each, `dist.multihost.CASE`):
#   train       a 2 x 2 job (mmsp-run --nnodes 2 on each host, no GLOO_SOCKET_IFNAME) trains
#               bitwise like 4 ranks on one host (fp64 losses and the saved weights), stopped
#               and resumed across the hosts too; the bytes that cross the hosts per step;
#   torchrun    the same job started by torchrun on each host (static rendezvous; the ranks
#               use torchrun's own store), equal too;
#   launchers   the same job started by OpenMPI's mpirun (its daemon on host 1 started through
#               netns_rsh.sh, as through ssh) and with the variables srun sets, equal too;
#   lost-host   host 1's ranks killed at once / host 1's link cut / the same for host 0,
#               which serves the store: the other host's ranks end within 15 s at the
#               defaults, naming the lost ranks and their host, non-zero; the last complete
#               checkpoint resumes and continues with the lost run's own losses;
#   interfaces  MASTER_ADDR a name that resolves to 127.0.1.1 on its own host (Debian's
#               /etc/hosts) trains; GLOO_SOCKET_IFNAME=lo or an unknown interface on one
#               host is refused on every rank with the reason;
#   flags       --out on one host only, or another --out path, refused on every rank
#               before the first collective, naming --out;
#   disks       --out on each host's own disk (a mount namespace per host): refused at
#               start-up naming the missing shared storage; per-host copies of --model
#               and --resume at one path that differ: refused naming each host's;
#   python      mmsp.patch across the hosts under torch.distributed.run --nnodes 2 (c10d
#               rendezvous) equals one process (needs PYTHON with the package built).
# Skips (exit 77) with the reason where network namespaces cannot be made (not root).
# Usage: multihost.sh BUILD_DIR SOURCE_DIR CASE [PYTHON]
set -u
build=$1
src=$2
case_name=$3
python=${4:-}
mmsp=$build/mmsp
run=$build/mmsp-run
skip() {
  echo "SKIPPED: $*"
  exit 77
}
[ "$(id -u)" = 0 ] || skip "network namespaces need root (CAP_NET_ADMIN and CAP_SYS_ADMIN); CI runs as root"
command -v ip > /dev/null || skip "no 'ip' (Debian's iproute2)"
command -v unshare > /dev/null || skip "no 'unshare' (util-linux)"

work=$(mktemp -d)
tag=mh$$                      # namespace and link names (at most 15 characters)
ns=(${tag}h0 ${tag}h1)
link=(${tag}a ${tag}b)
subnet="10.$((200 + $$ % 50)).$((($$ / 50) % 250))"
addr=($subnet.1 $subnet.2)
cleanup() {
  for n in "${ns[@]}"; do
    for p in $(ip netns pids "$n" 2> /dev/null); do kill -KILL "$p" 2> /dev/null; done
  done
  sleep 0.2
  for n in "${ns[@]}"; do
    ip netns del "$n" 2> /dev/null
    rm -rf "/etc/netns/$n"
  done
  [ -n "${MMSP_MULTIHOST_KEEP:-}" ] && cp -r "$work" "$MMSP_MULTIHOST_KEEP"  # the logs, to read after a failure
  rm -rf "$work"
}
trap cleanup EXIT
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
now() { date +%s.%N; }
since() { awk "BEGIN { printf \"%.2f\", $(now) - $1 }"; }
lt() { awk "BEGIN { exit !($1 < $2) }"; }

ip netns add "${ns[0]}" 2> "$work/netns.err" || skip "cannot make a network namespace: $(cat "$work/netns.err")"
ip netns add "${ns[1]}"
ip link add "${link[0]}" type veth peer name "${link[1]}" || skip "cannot make a veth pair"
for h in 0 1; do
  ip link set "${link[$h]}" netns "${ns[$h]}"
  ip -n "${ns[$h]}" addr add "${addr[$h]}/24" dev "${link[$h]}"
  ip -n "${ns[$h]}" link set lo up
  ip -n "${ns[$h]}" link set "${link[$h]}" up
  mkdir -p "/etc/netns/${ns[$h]}"
  # Each host's own /etc/hosts (ip netns exec mounts /etc/netns/NAME/hosts over it). The
  # host names do not resolve: c10d's own choice of interface would fall back to loopback.
  printf '127.0.0.1 localhost\n' > "/etc/netns/${ns[$h]}/hosts"
done
names_resolve() { printf '127.0.0.1 localhost\n%s node0\n%s node1\n' "${addr[0]}" "${addr[1]}" | tee "/etc/netns/${ns[0]}/hosts" > "/etc/netns/${ns[1]}/hosts"; }

# on H CMD...: CMD on host H (its network namespace, host name nodeH, own /etc/hosts).
on() {
  local h=$1
  shift
  ip netns exec "${ns[$h]}" unshare --uts sh -c 'hostname "$0" && exec "$@"' "node$h" "$@"
}
# on_own_disk H DIR CMD...: as on, with DIR replaced by host H's own directory DIR.hostH
# (a mount namespace of its own): the same path, another disk on each host.
on_own_disk() {
  local h=$1 dir=$2
  shift 2
  mkdir -p "$dir.host$h" "$dir"
  ip netns exec "${ns[$h]}" unshare --uts --mount --propagation private \
    sh -c 'hostname "$0" && mount --bind "$1" "$2" && shift 2 && exec "$@"' "node$h" "$dir.host$h" "$dir" "$@"
}
port() { echo $((20000 + RANDOM % 20000)); }
tx_bytes() { ip netns exec "${ns[$1]}" cat "/sys/class/net/$2/statistics/tx_bytes"; }

# job NAME [on|on_own_disk DIR] -- ARGS...: a 2 x 2 job, mmsp-run on each host as
# docs/launcher.md says (--master-addr: host 0's address, or $master); waits; sets
# status0/status1; logs NAME.0.log and NAME.1.log.
job() {
  local name=$1 runner=(on)
  shift
  [ "$1" = on_own_disk ] && runner=(on_own_disk "$2") && shift 2
  [ "$1" = -- ] && shift
  local p
  p=$(port)
  local pids=()
  for h in 0 1; do
    "${runner[0]}" $h "${runner[@]:1}" timeout 300 "$run" -n 2 --nnodes 2 --node-rank $h --master-addr "${master:-${addr[0]}}" \
      --master-port "$p" -- "$@" > "$work/$name.$h.log" 2>&1 &
    pids+=($!)
  done
  wait "${pids[0]}"
  status0=$?
  wait "${pids[1]}"
  status1=$?
}
# expect_refused NAME PATTERN [on|on_own_disk DIR] -- ARGS...: every rank exits 2 saying PATTERN.
expect_refused() {
  local name=$1 pattern=$2
  shift 2
  local t0
  t0=$(now)
  job "$name" "$@"
  local secs
  secs=$(since "$t0")
  echo "$name: exit $status0 / $status1 after $secs s"
  [ $status0 = 2 ] && [ $status1 = 2 ] || fail "$name: exit $status0 / $status1, not 2: $(tail -n 3 "$work/$name.0.log" "$work/$name.1.log")"
  lt "$secs" 20 || fail "$name: took $secs s"
  for r in 0 1 2 3; do
    grep -q "\[rank $r\] .*$pattern" "$work/$name.$((r / 2)).log" ||
      fail "$name: rank $r did not say /$pattern/: $(tail -n 3 "$work/$name.$((r / 2)).log")"
  done
}
losses_equal() {  # losses_equal A B WHAT: fp64 losses equal bit for bit
  "$mmsp" compare-losses "$1" "$2" > "$work/cmp.log" 2>&1
  grep -q "largest relative difference 0 " "$work/cmp.log" || fail "$3: the losses differ: $(cat "$work/cmp.log")"
}

train=(train --ring 2 --ulysses 2 --dtype float64 --tokens-per-rank 64 --attention-block 32 --warmup 1 --quiet)

case $case_name in
train)
  # One host: 4 ranks in host 0's namespace, over its loopback.
  on 0 "$run" -n 4 -- "$mmsp" "${train[@]}" --steps 6 --checkpoint-every 3 --out "$work/one" > "$work/one.log" 2>&1 ||
    fail "one host: $(tail -n 5 "$work/one.log")"
  sent0=$(($(tx_bytes 0 "${link[0]}") + $(tx_bytes 1 "${link[1]}")))
  t0=$(now)
  job two -- "$mmsp" "${train[@]}" --steps 6 --checkpoint-every 3 --out "$work/two"
  secs=$(since "$t0")
  [ $status0 = 0 ] && [ $status1 = 0 ] || fail "two hosts: exit $status0 / $status1: $(tail -n 5 "$work/two.0.log" "$work/two.1.log")"
  sent=$(($(tx_bytes 0 "${link[0]}") + $(tx_bytes 1 "${link[1]}") - sent0))
  grep -q "\[rank 0\] mmsp train: 2 hosts: node0 (${addr[0]} on ${link[0]}): ranks 0, 1; node1 (${addr[1]} on ${link[1]}): ranks 2, 3" \
    "$work/two.0.log" || fail "two hosts: rank 0 did not print the hosts: $(head -3 "$work/two.0.log")"
  losses_equal "$work/one/metrics.jsonl" "$work/two/metrics.jsonl" "two hosts"
  cmp -s "$work/one/step-000006/hf/model.safetensors" "$work/two/step-000006/hf/model.safetensors" ||
    fail "two hosts: the saved weights differ from one host's"
  echo "two hosts, 6 steps in $secs s: $((sent / 6)) bytes a step crossed the link (both directions, TCP/IP included)"
  # Stopped after step 3 on both hosts, resumed on both hosts.
  job stop -- "$mmsp" "${train[@]}" --steps 6 --checkpoint-every 3 --stop-after 3 --out "$work/resumed"
  [ $status0 = 0 ] && [ $status1 = 0 ] || fail "stop after 3: exit $status0 / $status1: $(tail -n 3 "$work/stop.0.log")"
  job resume -- "$mmsp" "${train[@]}" --steps 6 --checkpoint-every 3 --out "$work/resumed" --resume "$work/resumed"
  [ $status0 = 0 ] && [ $status1 = 0 ] || fail "resume: exit $status0 / $status1: $(tail -n 3 "$work/resume.0.log" "$work/resume.1.log")"
  grep -q "resumed from .* after step 3" "$work/resume.0.log" || fail "resume: did not start after step 3: $(head -3 "$work/resume.0.log")"
  losses_equal "$work/one/metrics.jsonl" "$work/resumed/metrics.jsonl" "stopped and resumed on two hosts"
  cmp -s "$work/one/step-000006/hf/model.safetensors" "$work/resumed/step-000006/hf/model.safetensors" ||
    fail "resumed on two hosts: the saved weights differ from one host's"
  ;;
lost-host)
  # lost WHAT VICTIM: a long 2 x 2 job that checkpoints every 3 steps; once a checkpoint
  # and a step after it are written, host VICTIM's ranks are killed at once (kill) or its
  # link is cut (link). The other host's ranks must end within 15 s (the defaults:
  # --heartbeat-timeout 10, mmsp-run --grace 2 --kill-after 3), non-zero, naming the lost
  # ranks and their host; the last complete checkpoint resumes on one host and repeats
  # the lost run's next step bit for bit.
  lost() {
    local how=$1 victim=$2 survivor=$((1 - $2)) name="lost-$1-$2"
    local p
    p=$(port)
    local pids=()
    for h in 0 1; do
      on $h "$run" -n 2 --nnodes 2 --node-rank $h --master-addr "${addr[0]}" --master-port "$p" -- \
        "$mmsp" "${train[@]}" --steps 100000 --checkpoint-every 3 --out "$work/$name" > "$work/$name.$h.log" 2>&1 &
      pids+=($!)
    done
    local k=0
    for ((i = 0; i < 1200; i++)); do
      k=$(sed 's/step-0*//' "$work/$name/latest" 2> /dev/null)
      [ -n "$k" ] && [ "$(grep -c . "$work/$name/metrics.jsonl" 2> /dev/null)" -gt "$k" ] && break
      sleep 0.1
    done
    [ -n "$k" ] || { fail "$name: no checkpoint within 120 s: $(tail -n 3 "$work/$name.0.log")"; return; }
    local t0
    t0=$(now)
    if [ "$how" = kill ]; then
      for q in $(ip netns pids "${ns[$victim]}"); do kill -KILL "$q"; done
    else
      ip -n "${ns[$victim]}" link set "${link[$victim]}" down
    fi
    wait "${pids[$survivor]}"
    local status=$? secs
    secs=$(since "$t0")
    echo "$name: host $victim lost ($how) after checkpoint step $k: host $survivor's job ended after $secs s, exit $status"
    grep "error\|failed" "$work/$name.$survivor.log" | head -n 4 | cut -c1-400
    [ "$status" != 0 ] || fail "$name: host $survivor's ranks exited 0"
    lt "$secs" 15 || fail "$name: host $survivor's ranks took $secs s (limit 15)"
    local lost_ranks="ranks $((2 * victim)), $((2 * victim + 1))" where="host node$victim (${addr[$victim]})"
    for r in $((2 * survivor)) $((2 * survivor + 1)); do
      if [ "$victim" = 1 ]; then
        grep -q "\[rank $r\] .*$lost_ranks on $where" "$work/$name.$survivor.log" ||
          grep -q "summary: rank $r killed by signal 15 (Terminated) (stopped by mmsp-run)" "$work/$name.$survivor.log" ||
          fail "$name: rank $r did not name $lost_ranks on $where: $(tail -n 6 "$work/$name.$survivor.log")"
      else  # the store's host: named with the ranks it holds
        grep -q "\[rank $r\] .*$where.*ranks 0, 1\|\[rank $r\] .*ranks 0, 1 on $where" "$work/$name.$survivor.log" ||
          grep -q "summary: rank $r killed by signal 15 (Terminated) (stopped by mmsp-run)" "$work/$name.$survivor.log" ||
          fail "$name: rank $r did not name the store's $where: $(tail -n 6 "$work/$name.$survivor.log")"
      fi
    done
    for q in $(ip netns pids "${ns[$victim]}"); do kill -KILL "$q"; done
    wait "${pids[$victim]}" 2> /dev/null
    ip -n "${ns[$victim]}" link set "${link[$victim]}" up
    # The last complete checkpoint: resumed on one host, its next step is the lost run's.
    k=$(sed 's/step-0*//' "$work/$name/latest")
    on 0 "$run" -n 4 -- "$mmsp" "${train[@]}" --steps 100000 --checkpoint-every 3 --stop-after $((k + 1)) \
      --resume "$work/$name" --out "$work/$name-check" > "$work/$name-check.log" 2>&1 ||
      fail "$name: the last checkpoint (step $k) does not resume: $(tail -n 4 "$work/$name-check.log")"
    local was now_
    was=$(grep "\"step\":$((k + 1))," "$work/$name/metrics.jsonl" | tail -n 1 | sed 's/.*"loss":\([^,]*\).*/\1/')
    now_=$(grep "\"step\":$((k + 1))," "$work/$name-check/metrics.jsonl" | tail -n 1 | sed 's/.*"loss":\([^,]*\).*/\1/')
    [ -n "$was" ] && [ "$was" = "$now_" ] || fail "$name: step $((k + 1)) after resuming step $k: loss '$now_', the lost run had '$was'"
  }
  if [ -n "${MMSP_MULTIHOST_ONLY:-}" ]; then lost $MMSP_MULTIHOST_ONLY; else
    lost kill 1
    lost link 1
    lost kill 0
    lost link 0
  fi
  ;;
interfaces)
  selftest=(selftest --ring 2 --ulysses 2 --timeout 30)
  # The user's fix of old, GLOO_SOCKET_IFNAME set on each host: still works.
  job ifname -- sh -c 'GLOO_SOCKET_IFNAME=$(ls /sys/class/net | grep -v "^lo$") exec "$0" "$@"' "$mmsp" "${selftest[@]}"
  [ $status0 = 0 ] && [ $status1 = 0 ] || fail "GLOO_SOCKET_IFNAME set on each host: exit $status0 / $status1: $(tail -n 4 "$work/ifname.0.log")"
  # MASTER_ADDR a name that host 0 resolves to 127.0.1.1 (Debian's /etc/hosts for the
  # machine's own name): rank 0's host reaches it over loopback, and mmsp listens on the
  # interface on host 1's network instead.
  names_resolve
  printf '127.0.0.1 localhost\n127.0.1.1 node0\n%s node1\n' "${addr[1]}" > "/etc/netns/${ns[0]}/hosts"
  master=node0 job by-name -- "$mmsp" "${selftest[@]}"
  [ $status0 = 0 ] && [ $status1 = 0 ] || fail "MASTER_ADDR resolving to 127.0.1.1 on its host: exit $status0 / $status1"
  grep -q "mmsp selftest: 2 hosts: node0 (${addr[0]} on ${link[0]}): ranks 0, 1; node1 (${addr[1]} on ${link[1]}): ranks 2, 3" \
    "$work/by-name.0.log" || fail "MASTER_ADDR resolving to 127.0.1.1 on its host: $(tail -n 5 "$work/by-name.0.log" "$work/by-name.1.log")"
  names_resolve
  # GLOO_SOCKET_IFNAME naming loopback, or no interface, on host 1: refused on every rank.
  expect_refused ifname-lo "rank 2 cannot start: GLOO_SOCKET_IFNAME=lo is a loopback interface, but the job's ranks are on 2 hosts" \
    -- sh -c '[ "$RANK" -ge 2 ] && export GLOO_SOCKET_IFNAME=lo; exec "$0" "$@"' "$mmsp" "${selftest[@]}"
  expect_refused ifname-missing "rank 2 cannot start: GLOO_SOCKET_IFNAME=eth9: this host has no interface of that name" \
    -- sh -c '[ "$RANK" -ge 2 ] && export GLOO_SOCKET_IFNAME=eth9; exec "$0" "$@"' "$mmsp" "${selftest[@]}"
  ;;
flags)
  # --out on host 0 only (a wrapper that adds it there), or another --out on host 1.
  expect_refused out-on-one-host \
    "different flags: --out is $work/a on ranks 0, 1 on host node0 (${addr[0]}) and (unset) on ranks 2, 3 on host node1 (${addr[1]})" \
    -- sh -c '[ "$RANK" -lt 2 ] && set -- "$@" --out '"$work/a"'; exec "$0" "$@"' "$mmsp" "${train[@]}" --steps 2
  expect_refused other-out "different flags: --out is $work/a on ranks 0, 1 on host node0 (${addr[0]}) and $work/b on ranks 2, 3" \
    -- sh -c '[ "$RANK" -lt 2 ] && o='"$work/a"' || o='"$work/b"'; exec "$0" "$@" --out "$o"' "$mmsp" "${train[@]}" --steps 2
  [ -e "$work/a/metrics.jsonl" ] || [ -e "$work/b/metrics.jsonl" ] && fail "a refused run wrote metrics"
  ;;
disks)
  # --out on each host's own disk at the same path: refused at start-up, naming it.
  expect_refused own-disks "--out $work/out is not one directory shared by the job's hosts: ranks 2, 3 on host node1 (${addr[1]}) do not see there the lock file rank 0 wrote" \
    on_own_disk "$work/out" -- "$mmsp" "${train[@]}" --steps 2 --out "$work/out"
  ls "$work/out.host1" | grep -q . && fail "host 1's disk is not empty after the refusal: $(ls -a "$work/out.host1")"
  ls "$work/out.host0" | grep -q "step-\|metrics" && fail "host 0's disk holds a run after the refusal: $(ls -a "$work/out.host0")"
  # Per-host copies of --model and --resume at one path that differ (other weights, a
  # checkpoint of another step): refused on every rank naming what each host holds,
  # before anything is loaded (by path alone they trained diverged replicas, or waited
  # for the collective timeout).
  on 0 "$run" -n 4 -- "$mmsp" "${train[@]}" --steps 4 --checkpoint-every 2 --keep 0 --out "$work/src" \
    > "$work/src.log" 2>&1 || fail "the copies' source run: $(tail -n 3 "$work/src.log")"
  mkdir -p "$work/copies.host0" "$work/copies.host1"
  cp -r "$work/src/step-000002/hf" "$work/copies.host0/model"
  cp -r "$work/src/step-000004/hf" "$work/copies.host1/model"
  cp -r "$work/src/step-000002" "$work/copies.host0/ckpt"
  cp -r "$work/src/step-000004" "$work/copies.host1/ckpt"
  expect_refused model-copies "the ranks loaded different inputs: --model is config xxh64 [0-9a-f]*, weights checksums.json [0-9a-f]* on ranks 0, 1 on host node0 (${addr[0]}) and config xxh64 [0-9a-f]*, weights checksums.json [0-9a-f]* on ranks 2, 3 on host node1 (${addr[1]})" \
    on_own_disk "$work/copies" -- "$mmsp" "${train[@]}" --steps 2 --model "$work/copies/model"
  expect_refused resume-copies "the ranks loaded different inputs: --resume is step 2, .* on ranks 0, 1 on host node0 (${addr[0]}) and step 4, .* on ranks 2, 3 on host node1 (${addr[1]})" \
    on_own_disk "$work/copies" -- "$mmsp" "${train[@]}" --steps 4 --timeout 30 --resume "$work/copies/ckpt"
  # The same --out shared by both hosts (the train case saves and resumes there).
  job shared -- "$mmsp" "${train[@]}" --steps 2 --out "$work/shared"
  [ $status0 = 0 ] && [ $status1 = 0 ] || fail "shared --out: exit $status0 / $status1: $(tail -n 3 "$work/shared.0.log")"
  [ -d "$work/shared/step-000002/hf" ] || fail "shared --out: no checkpoint of step 2"
  ;;
torchrun)
  # torchrun on each host (static rendezvous: --master-addr/--master-port, which the
  # ranks then share as their store), as docs/launcher.md's two-host recipe.
  [ -n "$python" ] && "$python" -c 'import torch.distributed.run' 2> /dev/null || skip "no Python with torch (PYTHON)"
  on 0 "$run" -n 4 -- "$mmsp" "${train[@]}" --steps 4 --out "$work/one" > "$work/one.log" 2>&1 ||
    fail "one host: $(tail -n 5 "$work/one.log")"
  p=$(port)
  pids=()
  for h in 0 1; do
    on $h timeout 300 "$python" -m torch.distributed.run --nnodes 2 --node-rank $h --nproc-per-node 2 \
      --master-addr "${addr[0]}" --master-port "$p" --no-python "$mmsp" "${train[@]}" --steps 4 --out "$work/two" \
      > "$work/torchrun.$h.log" 2>&1 &
    pids+=($!)
  done
  wait "${pids[0]}" && wait "${pids[1]}" ||
    fail "torchrun on two hosts: $(tail -n 5 "$work/torchrun.0.log" "$work/torchrun.1.log")"
  losses_equal "$work/one/metrics.jsonl" "$work/two/metrics.jsonl" "torchrun on two hosts"
  ;;
launchers)
  # The other launchers' two-host recipes of docs/launcher.md: OpenMPI's mpirun (its
  # daemon started on host 1 through netns_rsh.sh, as it would through ssh), and the
  # variables srun sets on each node (SLURM_PROCID, ...), each equal to one host.
  names_resolve
  on 0 "$run" -n 4 -- "$mmsp" "${train[@]}" --steps 4 --out "$work/one" > "$work/one.log" 2>&1 ||
    fail "one host: $(tail -n 5 "$work/one.log")"
  command -v mpirun > /dev/null || skip "no mpirun (Debian's openmpi-bin, which make installs)"
  p=$(port)
  MMSP_NETNS_node0=${ns[0]} MMSP_NETNS_node1=${ns[1]} on 0 timeout 300 mpirun --allow-run-as-root -np 4 \
    -H node0:2,node1:2 --bind-to none --mca plm_rsh_agent "$src/tests/dist/netns_rsh.sh" \
    -x MASTER_ADDR=node0 -x MASTER_PORT="$p" "$mmsp" "${train[@]}" --steps 4 --out "$work/mpi" > "$work/mpirun.log" 2>&1 ||
    fail "mpirun on two hosts: $(tail -n 8 "$work/mpirun.log")"
  losses_equal "$work/one/metrics.jsonl" "$work/mpi/metrics.jsonl" "mpirun on two hosts"
  p=$(port)
  pids=()
  for h in 0 1; do
    for l in 0 1; do
      on $h env SLURM_PROCID=$((2 * h + l)) SLURM_NTASKS=4 SLURM_LOCALID=$l SLURM_NTASKS_PER_NODE=2 \
        SLURM_JOB_NODELIST="node[0-1]" MASTER_ADDR=node0 MASTER_PORT="$p" \
        timeout 300 "$mmsp" "${train[@]}" --steps 4 --out "$work/slurm" > "$work/slurm.$h$l.log" 2>&1 &
      pids+=($!)
    done
  done
  for q in "${pids[@]}"; do wait "$q" || fail "Slurm's variables on two hosts: $(tail -n 4 "$work"/slurm.*.log)"; done
  losses_equal "$work/one/metrics.jsonl" "$work/slurm/metrics.jsonl" "Slurm's variables on two hosts"
  ;;
python)
  # mmsp.patch across the hosts: torch.distributed.run with c10d rendezvous on each host.
  [ -n "$python" ] && [ -n "${MMSP_PACKAGE_PATH:-}" ] || skip "no Python package (PYTHON, MMSP_PACKAGE_PATH)"
  names_resolve  # torch's own Gloo listens where the host name resolves (or GLOO_SOCKET_IFNAME)
  p=$(port)
  pids=()
  for h in 0 1; do
    on $h timeout 600 env HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 "$python" -m torch.distributed.run --nnodes 2 \
      --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint "${addr[0]}:$p" --rdzv-id "mh$$" \
      "$src/tests/dist/multihost_patch.py" > "$work/python.$h.log" 2>&1 &
    pids+=($!)
  done
  wait "${pids[0]}" && wait "${pids[1]}" || fail "mmsp.patch on two hosts: $(tail -n 15 "$work/python.0.log" "$work/python.1.log")"
  for r in 0 1 2 3; do
    grep -q "rank $r of 4: mmsp.patch equals one process" "$work/python.$((r / 2)).log" ||
      fail "mmsp.patch on two hosts: rank $r did not report: $(tail -n 5 "$work/python.$((r / 2)).log")"
  done
  ;;
bytes)
  # Not a test (no ctest entry): the figures of docs/bench/multihost.md. Bytes a steady
  # step moves over host 0's loopback when 4 ranks share it, and over the link when the
  # ranks are on two hosts (both directions, TCP/IP headers, store and heartbeats
  # included): the difference between a 12-step and a 4-step run, over 8 steps.
  link_bytes() { echo $(($(tx_bytes 0 "${link[0]}") + $(tx_bytes 1 "${link[1]}"))); }
  one_host() { on 0 "$run" -n 4 -- "$mmsp" "${train[@]}" --steps "$1" > "$work/one-$1.log" 2>&1; }
  a=$(tx_bytes 0 lo); one_host 4; b=$(tx_bytes 0 lo); one_host 12; c=$(tx_bytes 0 lo)
  lo_step=$(((c - b - (b - a)) / 8))
  a=$(link_bytes); job two4 -- "$mmsp" "${train[@]}" --steps 4; b=$(link_bytes)
  job two12 -- "$mmsp" "${train[@]}" --steps 12; c=$(link_bytes)
  link_step=$(((c - b - (b - a)) / 8))
  echo "{\"steady_step_bytes_one_host_loopback\": $lo_step, \"steady_step_bytes_two_hosts_link\": $link_step, \"ratio\": $(awk "BEGIN { printf \"%.3f\", $link_step / $lo_step }")}"
  ;;
*)
  echo "unknown case '$case_name'"
  exit 2
  ;;
esac

[ $failures = 0 ] && echo "multihost $case_name: all checks passed" || echo "multihost $case_name: $failures check(s) failed"
[ $failures = 0 ]
