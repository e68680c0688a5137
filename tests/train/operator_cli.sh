#!/bin/bash
# What an operator's audit found (docs/reliability.md), each reproduced with real ranks:
#  1. a flag given on one rank only (--lr, --dtype, --shard): every rank exits 2 within
#     10 s, naming the flag and each rank's value, before the first collective;
#  2. --out: a second job on a running job's --out is refused and the first ends 0 with
#     only its own checkpoints and metrics; a fresh run into a finished run is refused,
#     --overwrite replaces it; --resume of a finished run exits 0 with a note; a torn
#     last metrics line is cut by the resume and compare-losses reads the file; a kill
#     inside the --keep rotation leaves no half-deleted step dir;
#  3. NaN in a model's weights or in a pixel tensor: exit 2 naming the file, nothing in
#     --out; a shard that is a directory is named as one; a directory without
#     config.json says so; a 20000² PNG is named with its size;
#  4. num_hidden_layers 10^9 and 10^5, vision embed_dim 2^30: refused in < 10 s naming
#     the field, before anything is built; a 2.7 MB data line for 128-token rows: refused
#     before it is parsed;
#  5. --clip -1, --lr 1e308 and --save-gradients with --shard or into a non-empty
#     directory refused at the start; a sharded save that fails for lack
#     of space (a file-size limit) leaves no staged shards behind;
#  6. a stopped rank at the default --heartbeat-timeout (10 s) and mmsp-run's defaults:
#     the job is over in < 15 s, the stopped rank named by the others and in the summary;
#  7. a rank killed (SIGKILL) with no launcher: the survivors name it within 15 s.
# Usage: operator_cli.sh BUILD_DIR SOURCE_DIR
set -u
build=$1
src=$2
mmsp=$build/mmsp
run="$build/mmsp-run -n 2 --"
work=$(mktemp -d)
pids_to_kill=()
cleanup() {
  for p in "${pids_to_kill[@]}"; do kill -KILL "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
now() { date +%s.%N; }
since() { awk "BEGIN { printf \"%.2f\", $(now) - $1 }"; }
lt() { awk "BEGIN { exit !($1 < $2) }"; }
base=(train --ring 2 --tokens-per-rank 64 --attention-block 32 --warmup 1 --quiet)

# expect2 NAME PATTERN SECONDS ARGS...: under mmsp-run -n 2, exit 2 within SECONDS with
# PATTERN on both ranks.
expect2() {
  local name=$1 pattern=$2 limit=$3
  shift 3
  local t0
  t0=$(now)
  timeout 120 $run $mmsp "$@" > "$work/$name.log" 2>&1
  local status=$? secs
  secs=$(since "$t0")
  echo "$name: exit $status after $secs s"
  [ $status -eq 2 ] || fail "$name: exit status $status, not 2: $(tail -4 "$work/$name.log")"
  lt "$secs" "$limit" || fail "$name: took $secs s (limit $limit)"
  for r in 0 1; do
    grep -q "\[rank $r\] .*$pattern" "$work/$name.log" || fail "$name: rank $r did not say /$pattern/: $(tail -4 "$work/$name.log")"
  done
}

# --- 1. a flag on one rank only ------------------------------------------------------
cat > "$work/one-rank.sh" <<EOF
#!/bin/bash
extra=""
[ "\$RANK" = 1 ] && extra="\$ONE_RANK_FLAG"
exec $mmsp "\$@" \$extra
EOF
chmod +x "$work/one-rank.sh"
for flag in "--lr 0.01" "--dtype float64" "--shard optimizer" "--clip 0.1"; do
  name="flag_${flag//[^a-z0-9]/_}"
  t0=$(now)
  ONE_RANK_FLAG="$flag" timeout 120 $build/mmsp-run -n 2 -- "$work/one-rank.sh" "${base[@]}" --steps 6 \
    > "$work/$name.log" 2>&1
  status=$? secs=$(since "$t0")
  echo "$name: exit $status after $secs s"
  [ $status -eq 2 ] || fail "$name: exit $status, not 2: $(tail -4 "$work/$name.log")"
  lt "$secs" 10 || fail "$name: took $secs s"
  for r in 0 1; do
    grep -q "\[rank $r\] .*different flags: ${flag%% *} is .* on rank 0 and ${flag#* } on rank 1" "$work/$name.log" ||
      fail "$name: rank $r did not name the flag: $(tail -3 "$work/$name.log")"
  done
  grep -q "step 1 " "$work/$name.log" && fail "$name: a step ran"
done

# --- 2. one job per --out; fresh runs, --overwrite, finished runs, torn metrics -----
out="$work/run"
$run $mmsp "${base[@]}" --steps 20 --checkpoint-every 5 --seed 0 --out "$out" > "$work/first.log" 2>&1 &
first=$!
pids_to_kill+=($first)
for _ in $(seq 300); do [ -f "$out/.mmsp-lock" ] && [ -s "$out/.mmsp-lock" ] && break; sleep 0.1; done
expect2 second_job "--out $out is in use by another job (pid [0-9]* on " 15 \
  "${base[@]}" --steps 20 --checkpoint-every 5 --seed 1 --out "$out"
wait $first
status=$?
[ $status -eq 0 ] || fail "the first job exited $status: $(tail -4 "$work/first.log")"
[ "$(wc -l < "$out/metrics.jsonl")" -eq 20 ] || fail "metrics.jsonl has $(wc -l < "$out/metrics.jsonl") lines, not 20"
[ "$(cat "$out/latest")" = step-000020 ] || fail "latest is $(cat "$out/latest")"
grep -q '"seed": 0' "$out/step-000020/state.json" || fail "step 20 is not the first job's: $(grep seed "$out/step-000020/state.json")"

expect2 fresh_into_finished "--out $out already holds a run (metrics.jsonl (20 lines), step-000015, step-000020, latest)" 15 \
  "${base[@]}" --steps 40 --checkpoint-every 10 --out "$out"
[ "$(cat "$out/latest")" = step-000020 ] || fail "the refused run moved latest to $(cat "$out/latest")"

$run $mmsp "${base[@]}" --steps 20 --resume "$out" --out "$out" > "$work/finished.log" 2>&1
status=$?
[ $status -eq 0 ] || fail "--resume of a finished run exited $status: $(tail -3 "$work/finished.log")"
grep -q "note: nothing to do: the run in $out is complete at step 20 of --steps 20" "$work/finished.log" ||
  fail "--resume of a finished run gave no note: $(tail -3 "$work/finished.log")"

# a torn last line (a crash mid-write), then a resume to 22 steps with --allow-changed-flags
cp "$out/metrics.jsonl" "$work/metrics-before"
printf '{"step": 21, "loss": 1.2' >> "$out/metrics.jsonl"
$mmsp compare-losses "$out/metrics.jsonl" "$work/metrics-before" > "$work/torn-compare.log" 2>&1 ||
  fail "compare-losses failed on a torn last line: $(cat "$work/torn-compare.log")"
$run $mmsp "${base[@]}" --steps 22 --resume "$out" --out "$out" --allow-changed-flags > "$work/torn.log" 2>&1 ||
  fail "the resume after a torn line failed: $(tail -3 "$work/torn.log")"
grep -q "cut the torn last line (24 bytes)" "$work/torn.log" || fail "the resume did not say it cut the line: $(tail -3 "$work/torn.log")"
python3 -c "import json,sys; [json.loads(l) for l in open(sys.argv[1])]" "$out/metrics.jsonl" ||
  fail "metrics.jsonl is not whole lines after the resume"
[ "$(wc -l < "$out/metrics.jsonl")" -eq 22 ] || fail "metrics.jsonl has $(wc -l < "$out/metrics.jsonl") lines, not 22"

$run $mmsp "${base[@]}" --steps 4 --out "$out" --overwrite > "$work/overwrite.log" 2>&1 ||
  fail "--overwrite failed: $(tail -3 "$work/overwrite.log")"
[ "$(wc -l < "$out/metrics.jsonl")" -eq 4 ] || fail "after --overwrite metrics.jsonl has $(wc -l < "$out/metrics.jsonl") lines"
ls "$out" | grep -q step-000020 && fail "--overwrite left the old run's step-000020"

# a kill inside the --keep rotation (after its rename, before the deletion): no
# half-deleted step dir; the resume continues and the next save clears the leftover
MMSP_TEST_CRASH_IN_KEEP=3 $run $mmsp "${base[@]}" --steps 4 --checkpoint-every 1 --keep 1 --out "$work/keep" \
  > "$work/keep.log" 2>&1
grep -q "rank 0 .*status 86" "$work/keep.log" || fail "keep: the rotation hook did not fire: $(tail -3 "$work/keep.log")"
[ "$(ls "$work/keep" | grep step- | tr '\n' ' ')" = "step-000003 " ] ||
  fail "keep: visible step dirs after the kill: $(ls "$work/keep" | tr '\n' ' ')"
ls -a "$work/keep" | grep -q '^\.step-000002\.tmp-deleting$' || fail "keep: no renamed step-000002: $(ls -a "$work/keep" | tr '\n' ' ')"
$run $mmsp "${base[@]}" --steps 4 --checkpoint-every 1 --keep 1 --resume "$work/keep" --out "$work/keep" \
  > "$work/keep-resume.log" 2>&1 || fail "keep: the resume failed: $(tail -3 "$work/keep-resume.log")"
grep -q "resumed from .* after step 3" "$work/keep-resume.log" || fail "keep: the resume did not start after step 3"
ls -a "$work/keep" | grep -q tmp && fail "keep: the next save left $(ls -a "$work/keep" | grep tmp)"

# --- 3. non-finite weights and pixels; shards and config files that are not files ---
cfg="$src/configs/tiny-qwen2-vl.json"
$mmsp train --model "$cfg" --steps 1 --tokens-per-rank 64 --attention-block 32 --warmup 1 --quiet --dtype float32 \
  --out "$work/w" > "$work/w.log" 2>&1 || fail "could not write a model directory: $(tail -3 "$work/w.log")"
hf="$work/w/step-000001/hf"
rm -rf "$work/nan" && cp -r "$hf" "$work/nan" && rm -f "$work/nan/checksums.json"
python3 - "$work/nan/model.safetensors" <<'EOF' || fail "could not write a NaN into the weights"
import json, struct, sys
path = sys.argv[1]
with open(path, "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    name = "model.layers.1.mlp.up_proj.weight"
    begin = header[name]["data_offsets"][0]
    f.seek(8 + n + begin + 4 * 5)
    f.write(struct.pack("<f", float("nan")))
EOF
expect2 nan_weights "model.safetensors: tensor \"model.layers.1.mlp.up_proj.weight\" .* holds a NaN or infinite value at element 5" 30 \
  "${base[@]}" --steps 2 --model "$work/nan" --out "$work/nan-out"
[ -n "$(find "$work/nan-out" -type f ! -name .mmsp-lock 2>/dev/null)" ] && fail "nan_weights: wrote $(find "$work/nan-out" -type f)"

python3 - "$work/px.safetensors" <<'EOF' || fail "could not write a pixel tensor"
import json, struct, sys
rows, cols = 8, 3 * 2 * 14 * 14  # grid [1, 2, 4] of the tiny Qwen2-VL: patches x (C * tp * p * p)
values = [0.5] * (rows * cols)
values[7] = float("inf")
data = struct.pack("<%df" % len(values), *values)
header = json.dumps({"image_0": {"dtype": "F32", "shape": [rows, cols], "data_offsets": [0, len(data)]}}).encode()
header += b" " * (-len(header) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(header)) + header + data)
EOF
echo "{\"input_ids\": [1, 151652, 151655, 151655, 151653, 3, 2], \"images\": [{\"safetensors\": \"px.safetensors\", \"tensor\": \"image_0\"}], \"image_grid_thw\": [[1, 2, 4]]}" \
  > "$work/px.jsonl"
expect2 nan_pixels "px.safetensors\" holds a NaN or infinite value at element 7" 30 \
  "${base[@]}" --steps 2 --model "$cfg" --data "$work/px.jsonl" --out "$work/px-out"
[ -f "$work/px-out/metrics.jsonl" ] && fail "nan_pixels: left a metrics.jsonl"

# an RGB PNG of 20000 x 20000 (header only): stb_image gives up on it ("unknown image
# type"); the message gives the size from the PNG header
python3 - "$work/huge.png" <<'EOF' || fail "could not write the PNG header"
import struct, sys, zlib
def chunk(kind, data): return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
ihdr = struct.pack(">IIBBBBB", 20000, 20000, 8, 2, 0, 0, 0)
open(sys.argv[1], "wb").write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b""))
EOF
echo '{"input_ids": [1, 151652, 151655, 151655, 151653, 3, 2], "images": [{"path": "huge.png"}], "image_grid_thw": [[1, 2, 4]]}' \
  > "$work/huge.jsonl"
expect2 huge_png "huge.png\" is 20000 x 20000 = 400000000 pixels, more than --max-image-pixels" 10 \
  "${base[@]}" --model "$cfg" --data "$work/huge.jsonl"

$mmsp train --model "$cfg" --steps 1 --tokens-per-rank 64 --attention-block 32 --warmup 1 --quiet \
  --save-shard-size 20KB --out "$work/s" > "$work/s.log" 2>&1 || fail "could not write a sharded directory"
rm -rf "$work/dir-shard" && cp -r "$work/s/step-000001/hf" "$work/dir-shard" && rm -f "$work/dir-shard/checksums.json"
rm "$work/dir-shard/model-00002-of-"*.safetensors && mkdir "$work/dir-shard/$(cd "$work/s/step-000001/hf" && ls model-00002-of-*)"
expect2 shard_is_dir "shard file model-00002-of-[0-9]*.safetensors is not a regular file (a directory)" 30 \
  "${base[@]}" --steps 2 --model "$work/dir-shard"
mkdir -p "$work/no-config"
expect2 no_config "--model $work/no-config is a directory without config.json" 30 "${base[@]}" --model "$work/no-config"
rm -rf "$work/badcfg" && cp -r "$hf" "$work/badcfg" && rm -f "$work/badcfg/checksums.json"
sed -i 's/"num_attention_heads": *\([0-9]*\)/"num_attention_heads": 7/' "$work/badcfg/config.json"
expect2 config_named "$work/badcfg/config.json: .*num_attention_heads" 30 "${base[@]}" --model "$work/badcfg"

# --- 4. absurd architectures are refused while the config is read --------------------
for case in "num_hidden_layers:1000000000" "num_hidden_layers:100000" "embed_dim:1073741824"; do
  key=${case%%:*} value=${case#*:}
  sed "s/\"$key\": *[0-9]*/\"$key\": $value/" "$cfg" > "$work/big.json"
  expect2 "big_$key$value" "$key $value is beyond what mmsp builds: at most" 10 "${base[@]}" --model "$work/big.json"
done

# a data line far longer than any row of a step could use: refused before it is parsed
python3 -c "import json; print(json.dumps({'input_ids': list(range(1, 300001)), 'loss_mask': [1] * 300000}))" \
  > "$work/long.jsonl"
expect2 long_line "long.jsonl:1: the line is [0-9]* bytes, more than a sample that fits one row of a step needs" 10 \
  "${base[@]}" --model "$cfg" --data "$work/long.jsonl"

# --- 5. flags refused at the start --------------------------------------------------
expect2 clip_negative "--clip -1 must be ≥ 0" 10 "${base[@]}" --clip -1
expect2 lr_huge "--lr 1e+308 is beyond 1" 10 "${base[@]}" --lr 1e308
# --save-gradients: only where a rank holds the whole gradient, never over a user's files
expect2 grads_sharded "--save-gradients needs --shard none" 10 "${base[@]}" --shard optimizer \
  --save-gradients "$work/grads"
mkdir -p "$work/grads-full" && touch "$work/grads-full/mine"
expect2 grads_not_empty "--save-gradients $work/grads-full exists and is not empty" 10 "${base[@]}" \
  --save-gradients "$work/grads-full"
[ -f "$work/grads-full/mine" ] || fail "--save-gradients removed a file of the user's"

# --- 5b. a sharded save that runs out of space leaves no staged shards behind ----------
# (a file-size limit stands in for a full disk: writes past it fail with EFBIG)
(
  trap '' XFSZ
  ulimit -f 256
  exec $run $mmsp "${base[@]}" --steps 2 --shard optimizer --out "$work/full"
) > "$work/full.log" 2>&1
status=$?
[ $status -eq 2 ] || fail "full disk: exit $status, not 2: $(tail -3 "$work/full.log")"
grep -q "saving the checkpoint of step 2" "$work/full.log" || fail "full disk: no save error: $(tail -3 "$work/full.log")"
ls -a "$work/full" | grep -q "tmp" && fail "full disk: left $(ls -a "$work/full" | grep tmp)"

# --- 6. a stopped rank at the defaults (heartbeat 10 s, mmsp-run's grace) ------------
$build/mmsp-run -n 2 -- $mmsp train --ring 2 --tokens-per-rank 64 --attention-block 32 --steps 100000 \
  > "$work/stop.log" 2>&1 &
launcher=$!
pids_to_kill+=($launcher)
for _ in $(seq 600); do grep -q "step 2 |" "$work/stop.log" && break; sleep 0.1; done
victim=""
for p in $(ps -o pid= --ppid $launcher); do
  tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "RANK=1" && victim=$p
done
if [ -z "$victim" ]; then
  fail "stop: no rank 1 under mmsp-run: $(tail -3 "$work/stop.log")"
else
  pids_to_kill+=($victim)
  t0=$(now)
  kill -STOP "$victim"
  wait $launcher
  status=$? secs=$(since "$t0")
  echo "stopped rank at the defaults: job over after $secs s, exit $status"
  lt "$secs" 15 || fail "stop: the job took $secs s to end (limit 15)"
  [ $status -eq 3 ] || fail "stop: mmsp-run exited $status, not 3"
  grep -q "\[rank 0\] .*rank 1 has not answered for" "$work/stop.log" || fail "stop: rank 0 did not name rank 1: $(tail -4 "$work/stop.log")"
  grep -q "summary: rank 1 .*(it was stopped: the hung rank" "$work/stop.log" ||
    fail "stop: the summary did not mark rank 1 as the stopped one: $(grep summary "$work/stop.log")"
  grep -q "summary: rank 0 .*(first failure)" "$work/stop.log" && fail "stop: the healthy rank 0 is marked the first failure"
fi

# --- 7. a rank killed without a launcher: the survivors name it ----------------------
port=$($build/mmsp-run -n 1 --no-prefix -- sh -c 'echo $MASTER_PORT')
survivors=()
for r in 0 1 2; do
  env RANK=$r WORLD_SIZE=3 LOCAL_RANK=$r LOCAL_WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    timeout 120 $mmsp train --ring 3 --ulysses 1 --tokens-per-rank 64 --attention-block 32 --steps 100000 \
    > "$work/kill.$r.log" 2>&1 &
  pids_to_kill+=($!)
  [ $r = 2 ] || survivors+=($!)
done
for _ in $(seq 600); do grep -q "step 3 |" "$work/kill.0.log" && break; sleep 0.1; done
victim=$(for p in $(pgrep -x mmsp); do
  tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "MASTER_PORT=$port" &&
    tr '\0' '\n' < /proc/$p/environ | grep -qx "RANK=2" && echo $p
done | head -1)
if [ -z "$victim" ]; then
  fail "kill: no rank 2 process: $(tail -2 "$work/kill.0.log")"
else
  t0=$(now)
  kill -KILL "$victim"
  for p in "${survivors[@]}"; do wait "$p"; done
  secs=$(since "$t0")
  echo "rank 2 killed, no launcher: survivors ended after $secs s"
  lt "$secs" 15 || fail "kill: the survivors took $secs s"
  for r in 0 1; do
    grep -q "rank 2 stopped answering (died or hung" "$work/kill.$r.log" ||
      fail "kill: rank $r did not name rank 2: $(grep -v '^frame' "$work/kill.$r.log" | tail -2)"
  done
fi

if [ $failures -ne 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "operator_cli: all checks passed"
