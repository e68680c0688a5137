#!/usr/bin/env bash
# Starts N ranks of `mmsp selftest` by hand with the variables another launcher
# would set (torchrun, OpenMPI's mpirun, Slurm's srun) — no mmsp-run — and fails
# unless every rank exits 0 and rank 0 reports "passed".
# usage: run_without_launcher.sh MMSP MMSP_RUN STYLE N [selftest args...]
set -u
mmsp=$1 mmsp_run=$2 style=$3 n=$4
shift 4
# A free port, found the way mmsp-run finds one (bind to port 0), so parallel tests
# never collide.
port=$("$mmsp_run" -n 1 --no-prefix -- sh -c 'echo $MASTER_PORT')
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
pids=()
for ((r = 0; r < n; r++)); do
  case $style in
    torchrun) vars=(RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n) ;;
    openmpi) vars=(OMPI_COMM_WORLD_RANK=$r OMPI_COMM_WORLD_SIZE=$n OMPI_COMM_WORLD_LOCAL_RANK=$r
                   OMPI_COMM_WORLD_LOCAL_SIZE=$n) ;;
    slurm) vars=(SLURM_PROCID=$r SLURM_NTASKS=$n SLURM_LOCALID=$r SLURM_TASKS_PER_NODE="$n(x1)") ;;
    *) echo "unknown style $style"; exit 2 ;;
  esac
  env -u RANK -u WORLD_SIZE "${vars[@]}" MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      timeout 120 "$mmsp" selftest --timeout 60 "$@" > "$out/$r.log" 2>&1 &
  pids+=($!)
done
status=0
for ((r = 0; r < n; r++)); do
  wait "${pids[$r]}" || { echo "rank $r failed:"; cat "$out/$r.log"; status=1; }
done
grep -q "^passed" "$out/0.log" || { echo "rank 0 did not report passed:"; cat "$out/0.log"; status=1; }
[ $status = 0 ] && echo "$style: $n ranks passed without mmsp-run"
exit $status
