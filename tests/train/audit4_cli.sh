#!/bin/bash
# Reliability, part four (docs/reliability.md): what an audit of hostile users and careless
# operators found in `mmsp train`, each reproduced with real ranks under mmsp-run:
#  1. per-rank copies of --model with other weights (with and without checksums.json), and
#     of --resume at other steps: every rank exits 2 naming what each rank loaded, before
#     the first collective (before: diverged replicas with exit 0, or a wait until the
#     collective timeout); identical copies at other paths run;
#  2. a symbolic link planted as OUT/.mmsp-lock or OUT/metrics.jsonl is refused, and the
#     file it names is left as it was;
#  3. a job killed before its first checkpoint is requeued with --resume OUT and runs from
#     step 1 (as does --resume OUT of a fresh OUT); its losses are the uninterrupted run's;
#  4. --device auto / cpu and --attention-kernel auto / blockwise on a CPU are one choice;
#  5. a file that checksums.json does not list, which the loader would read (a
#     model.safetensors beside a sharded save), is refused naming it;
#  6. --memory-limit 0 on a model no host can hold: exit 2 with one line, no backtrace.
# Usage: audit4_cli.sh BUILD_DIR SOURCE_DIR
set -u
build=$1
src=$2
mmsp=$build/mmsp
run="$build/mmsp-run -n 2 --"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
now() { date +%s.%N; }
since() { awk "BEGIN { printf \"%.2f\", $(now) - $1 }"; }
lt() { awk "BEGIN { exit !($1 < $2) }"; }
base=(train --ulysses 2 --dtype float64 --tokens-per-rank 64 --attention-block 32 --warmup 1 --quiet --timeout 60)

# per_rank NAME 'RANK0 ARGS' 'RANK1 ARGS' ARGS...: rank r gets its own extra arguments.
cat > "$work/per-rank.sh" << EOF
#!/bin/bash
if [ "\$RANK" = 0 ]; then extra=\$RANK0_ARGS; else extra=\$RANK1_ARGS; fi
exec $mmsp "\$@" \$extra
EOF
chmod +x "$work/per-rank.sh"
# expect2 NAME PATTERN: the last run's log NAME.log, exit status in $status, took $secs
expect2() {
  echo "$1: exit $status after $secs s"
  [ "$status" = 2 ] || fail "$1: exit $status, not 2: $(tail -n 4 "$work/$1.log")"
  lt "$secs" 20 || fail "$1: took $secs s (limit 20)"
  for r in 0 1; do
    grep -q "\[rank $r\] .*$2" "$work/$1.log" || fail "$1: rank $r did not say /$2/: $(tail -n 4 "$work/$1.log")"
  done
}
per_rank() {  # per_rank NAME RANK0_ARGS RANK1_ARGS ARGS...
  local name=$1
  local t0
  t0=$(now)
  RANK0_ARGS=$2 RANK1_ARGS=$3 timeout 120 $build/mmsp-run -n 2 -- "$work/per-rank.sh" "${@:4}" > "$work/$name.log" 2>&1
  status=$?
  secs=$(since "$t0")
}

# --- 1. per-rank copies that differ ---------------------------------------------------
$run $mmsp "${base[@]}" --steps 4 --checkpoint-every 2 --keep 0 --out "$work/src" > "$work/src.log" 2>&1 ||
  fail "source run: $(tail -n 3 "$work/src.log")"
cp -r "$work/src/step-000002/hf" "$work/model-a"
cp -r "$work/src/step-000004/hf" "$work/model-b"
cp -r "$work/src/step-000002/hf" "$work/model-a-copy"
per_rank model-copies "--model $work/model-a" "--model $work/model-b" "${base[@]}" --steps 2
expect2 model-copies "the ranks loaded different inputs: --model is config xxh64 [0-9a-f]*, weights checksums.json [0-9a-f]* on rank 0 and .* on rank 1"
rm "$work"/model-a/checksums.json "$work"/model-b/checksums.json  # released directories have none
per_rank model-copies-released "--model $work/model-a" "--model $work/model-b" "${base[@]}" --steps 2
expect2 model-copies-released "the ranks loaded different inputs: --model is config xxh64 [0-9a-f]*, weights xxh64 [0-9a-f]* on rank 0"
per_rank model-same "--model $work/model-a-copy" "--model $work/src/step-000002/hf" "${base[@]}" --steps 2
[ "$status" = 0 ] || fail "identical copies of --model at other paths: exit $status: $(tail -n 3 "$work/model-same.log")"
per_rank resume-copies "--resume $work/src/step-000002" "--resume $work/src/step-000004" "${base[@]}" --steps 4
expect2 resume-copies "--resume is step 2, checkpoint checksums.json [0-9a-f]* on rank 0 and step 4, checkpoint checksums.json [0-9a-f]* on rank 1"

# --- 2. symbolic links planted in --out -------------------------------------------------
mkdir -p "$work/links"
echo precious > "$work/victim"
ln -s "$work/victim" "$work/links/.mmsp-lock"
t0=$(now)
timeout 60 $run $mmsp "${base[@]}" --steps 2 --out "$work/links" > "$work/lock-link.log" 2>&1
status=$? secs=$(since "$t0")
expect2 lock-link "--out $work/links: cannot open its lock file .*(it is a symbolic link"
[ "$(cat "$work/victim")" = precious ] || fail "lock-link: the link's target was written: $(cat "$work/victim")"
rm "$work/links/.mmsp-lock"
ln -s "$work/victim" "$work/links/metrics.jsonl"
t0=$(now)
timeout 60 $run $mmsp "${base[@]}" --steps 2 --out "$work/links" --overwrite > "$work/metrics-link.log" 2>&1
status=$? secs=$(since "$t0")
# --overwrite removes the run's files: a link is removed as a link, its target stays.
[ "$status" = 0 ] || fail "metrics-link with --overwrite: exit $status: $(tail -n 3 "$work/metrics-link.log")"
[ "$(cat "$work/victim")" = precious ] || fail "metrics-link: the link's target was written"
rm -f "$work/links/metrics.jsonl" && ln -s "$work/victim" "$work/links/metrics.jsonl"
t0=$(now)
timeout 60 $run $mmsp "${base[@]}" --steps 2 --out "$work/links" --resume "$work/links" > "$work/metrics-link2.log" 2>&1
status=$? secs=$(since "$t0")
expect2 metrics-link2 "metrics.jsonl is a symbolic link"
[ "$(cat "$work/victim")" = precious ] || fail "metrics-link2: the link's target was written"

# --- 3. a requeue before the first checkpoint -----------------------------------------
requeue=("${base[@]}" --steps 6 --checkpoint-every 5)
$run $mmsp "${requeue[@]}" --out "$work/ref" > "$work/ref.log" 2>&1 || fail "reference: $(tail -n 3 "$work/ref.log")"
# --resume OUT of a fresh OUT (a requeue loop's first start) runs from step 1.
$run $mmsp "${requeue[@]}" --out "$work/fresh" --resume "$work/fresh" > "$work/fresh.log" 2>&1 ||
  fail "--resume of a fresh --out: $(tail -n 3 "$work/fresh.log")"
grep -q "holds no checkpoint yet (the job stopped before its first save): this run starts from step 1" "$work/fresh.log" ||
  fail "fresh: no note: $(head -n 3 "$work/fresh.log")"
# Killed after step 2, before its first checkpoint (step 5): only its lock and metrics are there.
$run $mmsp "${requeue[@]}" --out "$work/killed" --test-sleep-in-step 0:3:60 > "$work/killed.log" 2>&1 &
launcher=$!
for _ in $(seq 600); do [ "$(grep -c . "$work/killed/metrics.jsonl" 2> /dev/null || echo 0)" -ge 2 ] && break; sleep 0.1; done
kill -KILL $launcher
wait $launcher 2> /dev/null
sleep 0.5
ls "$work/killed" | grep -q "step-\|latest" && fail "killed: a checkpoint was written before the kill"
$run $mmsp "${requeue[@]}" --out "$work/killed" --resume "$work/killed" > "$work/requeue.log" 2>&1 ||
  fail "requeue with --resume OUT: $(tail -n 3 "$work/requeue.log")"
$mmsp compare-losses "$work/ref/metrics.jsonl" "$work/killed/metrics.jsonl" > "$work/cmp.log" 2>&1
grep -q "6 common steps, largest relative difference 0 " "$work/cmp.log" || fail "requeue: losses differ: $(cat "$work/cmp.log")"
# A --resume elsewhere that holds no checkpoint is still an error.
mkdir -p "$work/empty"
t0=$(now)
timeout 60 $run $mmsp "${requeue[@]}" --out "$work/other" --resume "$work/empty" > "$work/empty.log" 2>&1
status=$? secs=$(since "$t0")
expect2 empty "$work/empty: not a checkpoint"

# --- 4. equal choices written two ways -------------------------------------------------
per_rank same-choices "--device auto --attention-kernel auto" "--device cpu --attention-kernel blockwise" \
  "${base[@]}" --steps 1
[ "$status" = 0 ] || fail "--device auto/cpu and --attention-kernel auto/blockwise: exit $status: $(tail -n 3 "$work/same-choices.log")"

# --- 5. a file checksums.json does not list -------------------------------------------
$mmsp train --dtype float64 --tokens-per-rank 64 --steps 1 --quiet --save-shard-size 300KB --out "$work/sharded" \
  > "$work/sharded.log" 2>&1 || fail "sharded save: $(tail -n 3 "$work/sharded.log")"
hf=$work/sharded/step-000001/hf
[ -f "$hf/model.safetensors.index.json" ] || fail "the save is not sharded: $(ls "$hf")"
cp "$work/model-b/model.safetensors" "$hf/model.safetensors"  # other weights, not in the manifest
t0=$(now)
timeout 60 $run $mmsp "${base[@]}" --steps 1 --model "$hf" > "$work/unlisted.log" 2>&1
status=$? secs=$(since "$t0")
expect2 unlisted "$hf/model.safetensors is not listed in $hf/checksums.json"

# --- 6. --memory-limit 0 on a model no host holds ---------------------------------------
python3 - "$src/configs/tiny-qwen2-vl.json" "$work/huge.json" << 'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(hidden_size=32768, intermediate_size=1048576, num_attention_heads=2048, num_key_value_heads=2048,
         vocab_size=1000000)
c["vision_config"]["hidden_size"] = 32768
json.dump(c, open(sys.argv[2], "w"))
EOF
t0=$(now)
timeout 120 $mmsp train --model "$work/huge.json" --memory-limit 0 --steps 1 --tokens-per-rank 64 > "$work/oom.log" 2>&1
status=$? secs=$(since "$t0")
echo "oom: exit $status after $secs s"
[ "$status" = 2 ] || fail "oom: exit $status, not 2: $(tail -n 3 "$work/oom.log")"
grep -q "error: out of memory on this rank (.*can't allocate memory.*--memory-limit 0 turned the memory preflight off" \
  "$work/oom.log" || fail "oom: $(tail -n 3 "$work/oom.log")"
grep -q "frame #\|Exception raised from" "$work/oom.log" && fail "oom: a backtrace was printed"

if [ $failures -ne 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "audit4_cli: all checks passed"
