#!/bin/bash
# `mmsp train` as a user runs it, under mmsp-run with 2 real ranks:
#  1. a crash in the middle of writing a checkpoint leaves the previous one loadable,
#     and resuming from it gives the losses of a run never interrupted;
#  2. bad flags and bad data end with a clear message from every rank, and no hang;
#  3. a checkpoint's hf/ directory fine-tunes (mmsp train --model DIR), and a damaged or
#     mismatched model directory, or a model too big for the memory limit, ends with
#     exit 2 on every rank before anything is written;
#  4. --shard optimizer: saved on 4 ranks (one optimizer file per rank), resumed on 3
#     ranks with --shard parameters and on 2 with --shard gradients, the continued
#     losses equal the uninterrupted 4-rank run's;
#  5. mmsp bench memory --shard LEVEL measures only that level's rows, writes each row as
#     it ends, and --vocab / --layers / --vision-layers scale the config they name;
#  6. the RL trainer half: mmsp logprobs of preference pairs, their sums as the reference,
#     mmsp train --objective dpo (first loss ln 2), refusals; mmsp bench logprobs's figures;
#  7. a mixture-of-experts model with --expert 2 under ZeRO-3 saved, resumed with --expert 2
#     --shard gradients and --expert 1 --shard optimizer: the uninterrupted losses; mmsp
#     bench experts's bytes equal the formula.
# Usage: train_cli.sh BUILD_DIR SOURCE_DIR
set -u
build=$1
src=$2
mmsp=$build/mmsp
run="$build/mmsp-run -n 2 --"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
train=(train --steps 4 --tokens-per-rank 128 --dtype float64 --warmup 1 --attention-block 32 --quiet)

# --- 1. crash while saving the checkpoint of step 4 -------------------------------
$run $mmsp "${train[@]}" --ulysses 2 --out "$work/ref" > "$work/ref.log" 2>&1 || fail "reference run: $(tail -5 "$work/ref.log")"
MMSP_TEST_CRASH_CHECKPOINT=4:20000 $run $mmsp "${train[@]}" --ulysses 2 --checkpoint-every 2 \
  --out "$work/crash" > "$work/crash.log" 2>&1 && fail "the run that crashes in its checkpoint exited 0"
grep -q "rank 0 .*status 86" "$work/crash.log" || fail "the launcher did not report rank 0's crash (status 86): $(tail -3 "$work/crash.log")"
[ "$(cat "$work/crash/latest" 2>/dev/null)" = step-000002 ] || fail "latest is '$(cat "$work/crash/latest" 2>/dev/null)', not step-000002"
ls -a "$work/crash" | grep -q '\.tmp' || fail "the crash left no partial checkpoint: the hook did not fire mid-save"
$run $mmsp "${train[@]}" --ulysses 2 --checkpoint-every 2 --resume "$work/crash" --out "$work/crash" \
  > "$work/resume.log" 2>&1 || fail "resume after the crash failed: $(tail -5 "$work/resume.log")"
grep -q "resumed from .* after step 2" "$work/resume.log" || fail "resume did not start after step 2"
[ "$(cat "$work/crash/latest")" = step-000004 ] || fail "the resumed run did not write step 4"
ls -a "$work/crash" | grep -q '\.tmp' && fail "the next save did not clean the partial checkpoint"
$mmsp compare-losses "$work/ref/metrics.jsonl" "$work/crash/metrics.jsonl" > "$work/cmp.log" 2>&1 || fail "compare-losses failed"
grep -q "4 common steps, largest relative difference 0 " "$work/cmp.log" || fail "resumed losses differ: $(cat "$work/cmp.log")"

# --- 2. bad input: a clear message on every rank, non-zero exit, no hang -------------
expect_error() {  # expect_error NAME PATTERN ARGS...
  local name=$1 pattern=$2
  shift 2
  timeout 120 $run $mmsp "$@" > "$work/$name.log" 2>&1
  local status=$?
  [ $status -eq 124 ] && { fail "$name: hung"; return; }
  [ $status -eq 0 ] && { fail "$name: exited 0"; return; }
  for r in 0 1; do
    grep -q "\[rank $r\] .*error: .*$pattern" "$work/$name.log" || fail "$name: rank $r did not say /$pattern/: $(tail -4 "$work/$name.log")"
  done
}
expect_error mesh "world size 2 is not" train --ring 2 --ulysses 2
expect_error steps "--steps 0 must be positive" train --steps 0
expect_error model "'nope' is neither a built-in model" train --model nope
expect_error vision "vision mode 'x'" train --vision x
expect_error checkpointing "--checkpoint-activations 'layers' must be none, decoder" train --checkpoint-activations layers
expect_error loss_chunk "--loss-chunk -3 must be ≥ 0" train --loss-chunk -3
expect_error offload "--offload-activations keeps the inputs of recomputed layers in host memory: it needs" \
  train --offload-activations
expect_error tiled_mlp "--tiled-mlp '0' must be off, auto" train --tiled-mlp 0
# fine-tuning's flags (issue 71; the rest in Finetune.BadInputIsRefusedBeforeAnyCollective)
expect_error lora_rank "--lora-rank 0 must be ≥ 1" train --lora-rank 0
expect_error lora_target '"qkv" names no linear map of this qwen2_vl model' train --lora-rank 4 --lora-targets q_proj,qkv
expect_error freeze_all "freezes every parameter" train --freeze vision,merger,llm,embeddings
expect_error data_file "missing.jsonl" train --data "$work/missing.jsonl" --model "$src/configs/tiny-qwen2-vl.json"

cfg="$src/configs/tiny-qwen2-vl.json"
# --- 2b. checked on every rank before the first collective: --out, image sizes, sample
# lengths, config ranges ------------------------------------------------------------
touch "$work/a-file"
expect_error out_file "--out $work/a-file is not a directory" train --out "$work/a-file"
expect_error out_unwritable "--out /proc/mmsp-out: cannot create the directory" train --out /proc/mmsp-out
data="$src/examples/data/data.jsonl"
expect_error image_pixels "circle.png\" is 56 x 56 = 3136 pixels, more than --max-image-pixels 3000" \
  train --data "$data" --model "$cfg" --max-image-pixels 3000
expect_error sample_length "the sample has 17 tokens, more than one row of a step holds (16" \
  train --data "$data" --model "$cfg" --tokens-per-rank 8
sed 's/"temporal_patch_size": *[0-9]*/"temporal_patch_size": 5000000/' "$cfg" > "$work/tps.json"
grep -q 5000000 "$work/tps.json" || fail "could not write the temporal_patch_size config"
expect_error temporal_patch "vision_config.temporal_patch_size 5000000 is beyond what a vision tower uses" \
  train --data "$data" --model "$work/tps.json"

# --- 2c. resume: flags that change the batches or numerics are named and refused ------
$run $mmsp "${train[@]}" --ulysses 2 --stop-after 2 --out "$work/stop" > "$work/stop.log" 2>&1 ||
  fail "the run that stops after step 2 failed: $(tail -5 "$work/stop.log")"
expect_error resume_changed "this run changes 2 flags that change the batches or the numerics" \
  "${train[@]}" --ulysses 2 --resume "$work/stop" --seed 1 --no-shuffle
grep -q -- "--seed 0 -> 1: another data order" "$work/resume_changed.log" || fail "resume did not name --seed"
grep -q -- "--no-shuffle true -> false" "$work/resume_changed.log" || fail "resume did not name --no-shuffle"
grep -q -- "--allow-changed-flags" "$work/resume_changed.log" || fail "resume did not name --allow-changed-flags"
$run $mmsp "${train[@]}" --ulysses 2 --resume "$work/stop" --seed 1 --allow-changed-flags \
  > "$work/resume_allowed.log" 2>&1 || fail "--allow-changed-flags did not resume: $(tail -5 "$work/resume_allowed.log")"
grep -q "note: --allow-changed-flags" "$work/resume_allowed.log" || fail "the allowed resume gave no note"
# Another mesh (ring instead of ulysses) passes silently; `latest` as a symbolic link is followed.
rm "$work/stop/latest" && ln -s step-000002 "$work/stop/latest"
$run $mmsp "${train[@]}" --ring 2 --resume "$work/stop" --out "$work/stop" > "$work/resume_mesh.log" 2>&1 ||
  fail "resume on another mesh through a latest link failed: $(tail -5 "$work/resume_mesh.log")"
grep -q "resumed from .* after step 2" "$work/resume_mesh.log" || fail "the mesh-change resume did not start after step 2"
grep -q "note:" "$work/resume_mesh.log" && fail "a mesh change gave a note: $(grep note: "$work/resume_mesh.log")"

# JSON-lines data with one fault each, for the tiny Qwen2-VL config
cfg="$src/configs/tiny-qwen2-vl.json"
cp "$src"/examples/data/*.png "$work/" 2>/dev/null
img=$(cd "$work" && ls *.png | head -1)
vs=151652; ve=151653; ip=151655
echo "{\"input_ids\": [1, 2, 151936], \"loss_mask\": [1, 1, 1]}" > "$work/vocab.jsonl"
expect_error vocab "151936" train --data "$work/vocab.jsonl" --model "$cfg"
echo "{\"input_ids\": [1, $vs, $ip, $ip, $ve, 2], \"images\": [{\"path\": \"no-such.png\"}], \"image_grid_thw\": [[1, 2, 4]]}" > "$work/noimage.jsonl"
expect_error missing_image "no-such.png" train --data "$work/noimage.jsonl" --model "$cfg"
echo "{\"input_ids\": [1, $vs, $ip, $ip, $ip, $ve, 2], \"images\": [{\"path\": \"$img\"}], \"image_grid_thw\": [[1, 2, 2]]}" > "$work/count.jsonl"
expect_error placeholders "placeholder" train --data "$work/count.jsonl" --model "$cfg"

# A step's vision tower is priced from its plan before the step (train/memory/vision_load.h):
# one video of 200 frames (1,600 patches) encoded whole on one rank is refused on every
# rank under a limit 1 MiB above the run's preflight, naming the step, the busiest rank
# and its patches; split over the two ranks (--vision-split 1) each encodes 800.
frames=$(for i in $(seq 200); do printf '"move_%d.png",' $((i % 3)); done)
pads=$(for i in $(seq 400); do printf '151656,'; done)
echo "{\"input_ids\": [1, $vs, ${pads%,}, $ve, 2], \"videos\": [{\"frames\": [${frames%,}]}]}" > "$work/video.jsonl"
video=(train --data "$work/video.jsonl" --model "$cfg" --steps 1 --tokens-per-rank 256)
$run $mmsp "${video[@]}" --memory-limit 0 > "$work/video.log" 2>&1 || fail "the long video run: $(tail -5 "$work/video.log")"
mib=$(grep -o 'total *[0-9.]* MiB' "$work/video.log" | head -1 | grep -o '[0-9.]*')
[ -n "$mib" ] || fail "the video run printed no estimate in MiB: $(grep total "$work/video.log")"
limit=$(python3 -c "print(int(($mib + 1) * 2**20))")
expect_error video_whole "step 1 (samples 0): the vision tower of dp rank 0, context rank [01] encodes 1600 patches" \
  "${video[@]}" --memory-limit "$limit"
grep -q "vision-split auto spreads" "$work/video_whole.log" || fail "the refused step did not name --vision-split"
expect_error video_split "encodes 800 patches (its largest item 1600 patches" \
  "${video[@]}" --memory-limit "$limit" --vision-split 1

# --- 3. Hugging Face model directories in and out; the memory preflight -------------
# Two fp64 steps saved with small shards, as released models are, then fine-tuned.
short=(train --steps 2 --tokens-per-rank 128 --dtype float64 --warmup 1 --attention-block 32 --quiet)
$run $mmsp "${short[@]}" --save-shard-size 1MB --out "$work/sharded" > "$work/sharded.log" 2>&1 \
  || fail "sharded save: $(tail -5 "$work/sharded.log")"
hf="$work/sharded/step-000002/hf"
[ -f "$hf/model.safetensors.index.json" ] && [ -f "$hf/model-00001-of-00004.safetensors" ] \
  || fail "no sharded hf/ directory: $(ls "$hf")"
$run $mmsp "${short[@]:0:${#short[@]}-1}" --model "$hf" --out "$work/finetune" > "$work/finetune.log" 2>&1 \
  || fail "fine-tune from hf/: $(tail -5 "$work/finetune.log")"
grep -q "weights loaded" "$work/finetune.log" || fail "the fine-tune did not say it loaded weights"

expect_exit2() {  # expect_exit2 NAME PATTERN ARGS...: exit 2, the message on both ranks, no file in --out
  # (every rank probes --out before anything else, so the directory itself may exist, and
  # rank 0 locks it: .mmsp-lock, which names the owner, is no output)
  local name=$1 pattern=$2
  shift 2
  timeout 120 $run $mmsp "$@" --out "$work/out-$name" > "$work/$name.log" 2>&1
  local status=$?
  [ $status -eq 2 ] || fail "$name: exit status $status, not 2: $(tail -3 "$work/$name.log")"
  for r in 0 1; do  # the message may span lines, each with the rank's prefix
    grep -q "\[rank $r\] .*error: " "$work/$name.log" && grep -q "\[rank $r\] .*$pattern" "$work/$name.log" \
      || fail "$name: rank $r did not say /$pattern/: $(tail -4 "$work/$name.log")"
  done
  [ -n "$(find "$work/out-$name" -type f ! -name .mmsp-lock 2>/dev/null)" ] && fail "$name: wrote $(find "$work/out-$name" -type f ! -name .mmsp-lock)"
}
damaged() {  # a fresh copy of the sharded directory to damage, without its checksums.json
  rm -rf "$work/bad" && cp -r "$hf" "$work/bad" && rm "$work/bad/checksums.json"  # (as a released model)
}
# with its checksums.json, the damaged file is named before anything is parsed
rm -rf "$work/bad" && cp -r "$hf" "$work/bad"
sed -i 's/"total_size": [0-9]*/"total_size": 12/' "$work/bad/model.safetensors.index.json"
expect_exit2 checksum "model.safetensors.index.json: .*records" "${short[@]}" --model "$work/bad"
damaged; rm "$work/bad/model-00002-of-00004.safetensors"
expect_exit2 missing_shard "shard file model-00002-of-00004.safetensors is missing" "${short[@]}" --model "$work/bad"
damaged; sed -i 's/"total_size": [0-9]*/"total_size": 12/' "$work/bad/model.safetensors.index.json"
expect_exit2 total_size "total_size is 12" "${short[@]}" --model "$work/bad"
damaged; sed -i 's/"weight_map": {/"weight_map": {\n    "extra.weight": "model-00001-of-00004.safetensors",/' "$work/bad/model.safetensors.index.json"
expect_exit2 index_lists "extra.weight" "${short[@]}" --model "$work/bad"
damaged; sed -i 's/"num_hidden_layers": 3/"num_hidden_layers": 4/' "$work/bad/config.json"
expect_exit2 missing_tensor "missing from the files, e.g. \"model.layers.3" "${short[@]}" --model "$work/bad"
damaged; sed -i 's/"num_hidden_layers": 3/"num_hidden_layers": 2/' "$work/bad/config.json"
expect_exit2 unexpected_tensor "unexpected (the model has no such parameter), e.g. \"model.layers.2" "${short[@]}" --model "$work/bad"
damaged; sed -i 's/"intermediate_size": 256/"intermediate_size": 192/' "$work/bad/config.json"
expect_exit2 shape "with the wrong shape" "${short[@]}" --model "$work/bad"
expect_exit2 preflight "needs about .* GiB per rank" "${short[@]}" --model "$src/configs/hf/Qwen2-VL-7B-Instruct.json"
expect_exit2 memory_limit "allows 1.00 MiB" "${short[@]}" --memory-limit 1MiB

# --- 4. sharded optimizer state: resume on another number of ranks ------------------
# 384 tokens a step: 96 per rank on 4, 128 on 3, 192 on 2 (the same batches).
zero=(train --steps 4 --dtype float64 --warmup 1 --attention-block 32 --quiet --shard optimizer)
# The resumes run at the other levels (ZeRO-3 on 3 ranks, ZeRO-2 on 2): one checkpoint format.
resume_level=([3]=parameters [2]=gradients)
$build/mmsp-run -n 4 -- $mmsp "${zero[@]}" --tokens-per-rank 96 --ring 2 --out "$work/zero-whole" \
  > "$work/zero-whole.log" 2>&1 || fail "4-rank sharded run: $(tail -5 "$work/zero-whole.log")"
$build/mmsp-run -n 4 -- $mmsp "${zero[@]}" --tokens-per-rank 96 --ring 2 --stop-after 2 --out "$work/zero-split" \
  > "$work/zero-split.log" 2>&1 || fail "4-rank sharded save: $(tail -5 "$work/zero-split.log")"
ls "$work/zero-split/step-000002/optimizer" | tr '\n' ' ' | grep -q "rank-00000-of-00004.safetensors rank-00001-of-00004.safetensors rank-00002-of-00004.safetensors rank-00003-of-00004.safetensors" \
  || fail "no per-rank optimizer files: $(ls "$work/zero-split/step-000002")"
grep -q "optimizer/rank-00003-of-00004.safetensors" "$work/zero-split/step-000002/checksums.json" \
  || fail "checksums.json does not cover the optimizer shards"
for n in 3 2; do
  mesh=$([ $n = 3 ] && echo "--ring 3" || echo "--ulysses 2")
  $build/mmsp-run -n $n -- $mmsp "${zero[@]/optimizer/${resume_level[$n]}}" --tokens-per-rank $((384 / n)) $mesh \
    --resume "$work/zero-split" \
    --out "$work/zero-$n" > "$work/zero-$n.log" 2>&1 || fail "resume on $n ranks: $(tail -5 "$work/zero-$n.log")"
  $mmsp compare-losses "$work/zero-whole/metrics.jsonl" "$work/zero-$n/metrics.jsonl" > "$work/zero-cmp-$n.log" 2>&1
  awk '/largest relative difference/ { for (i = 1; i < NF; ++i) if ($i == "difference") d = $(i + 1); exit !(d + 0 < 1e-9) }' \
    "$work/zero-cmp-$n.log" || fail "resumed on $n ranks, the losses differ: $(cat "$work/zero-cmp-$n.log")"
  grep -q "2 common steps" "$work/zero-cmp-$n.log" || fail "resumed on $n ranks: $(cat "$work/zero-cmp-$n.log")"
done
# One flipped byte in one rank's optimizer file: the resume refuses it, naming the file.
shard1="$work/zero-split/step-000002/optimizer/rank-00001-of-00004.safetensors"
at=$(( $(stat -c %s "$shard1") - 3 ))
byte=$(od -An -tu1 -j $at -N1 "$shard1" | tr -d ' ')
printf "\\$(printf %o $(( byte ^ 1 )))" | dd of="$shard1" bs=1 seek=$at conv=notrunc status=none
expect_exit2 zero_damaged "rank-00001-of-00004.safetensors" "${zero[@]}" --tokens-per-rank 192 --ulysses 2 \
  --resume "$work/zero-split"

# --- 5. mmsp bench memory --shard: only the rows of the levels asked for -------------
$run $mmsp bench memory --model "$src/configs/tiny-qwen2-vl.json" --tokens-per-rank 32 --steps 1 --shard parameters \
  --out "$work/bench-memory.json" > "$work/bench-memory.log" 2>&1 || fail "bench memory --shard: $(tail -5 "$work/bench-memory.log")"
python3 - "$work/bench-memory.json" <<'PY' || fail "bench memory --shard parameters: wrong rows"
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
assert [(r["shard"], r["checkpoint_activations"], r["tiled_mlp"], r["offload_activations"]) for r in rows] == [
    ("parameters", "decoder", "off", False), ("parameters", "all", "off", False),
    ("parameters", "all", "auto", False), ("parameters", "all", "auto", True)], rows
assert all(r["measured"]["step_peak_bytes"] > 0 and r["estimate"]["total"] > 0 for r in rows)
PY
grep -q "bench memory: row 2: shard parameters, checkpoint all" "$work/bench-memory.log" ||
  fail "bench memory did not report its rows as they ended: $(tail -3 "$work/bench-memory.log")"
# A smaller vocabulary takes (V - 256) rows off the untied embedding and head, h = 64 each;
# fewer layers and vision blocks cut Qwen3-VL's deepstack list to the blocks kept. Unsharded,
# what a rank holds after the step (weights, gradients, both moments: 16 bytes a
# parameter in fp32) is the preflight's training state, give or take a last collective's
# few bytes that Gloo's thread may not have freed yet (152 seen on rank 1).
$run $mmsp bench memory --model "$src/configs/tiny-qwen2-vl.json" --tokens-per-rank 32 --steps 1 --shard none \
  --vocab 256 --out "$work/bench-vocab.json" > "$work/bench-vocab.log" 2>&1 || fail "bench memory --vocab: $(tail -5 "$work/bench-vocab.log")"
$run $mmsp bench memory --model "$src/configs/tiny-qwen3-vl.json" --tokens-per-rank 32 --steps 1 --shard parameters \
  --layers 1 --vision-layers 1 --out "$work/bench-depth.json" > "$work/bench-depth.log" 2>&1 ||
  fail "bench memory --layers 1 --vision-layers 1: $(tail -5 "$work/bench-depth.log")"
# LoRA under --shard parameters: the base's layers sharded in the model's dtype, the rest of
# the frozen weights whole, the adapters' masters and moments sharded: what a rank holds after
# the step is the preflight's training state within 1 %; the frozen head makes no gradient
# (its [V, h] once put the backward's measured peak 1.37x above the preflight's).
$run $mmsp bench memory --model "$src/configs/tiny-qwen2-vl.json" --tokens-per-rank 32 --steps 1 --shard parameters \
  --lora-rank 4 --vocab 256 --out "$work/bench-lora.json" > "$work/bench-lora.log" 2>&1 ||
  fail "bench memory --lora-rank 4: $(tail -5 "$work/bench-lora.log")"
python3 - "$work/bench-memory.json" "$work/bench-vocab.json" "$work/bench-depth.json" "$work/bench-lora.json" <<'PY' || fail "bench memory scaled rows"
import json, sys
whole, vocab, depth, lora = (json.load(open(f))["rows"] for f in sys.argv[1:])
for r in lora:
    state = r["estimate"]["training_state"]
    assert all(abs(s - state) <= 0.01 * state for s in r["measured"]["state_bytes_per_rank"]), r
assert vocab[0]["vocab"] == 256, vocab[0]
for r in vocab:
    assert r["estimate"]["training_state"] == 16 * r["parameters"], r
    assert all(0 <= s - 16 * r["parameters"] < 1024 for s in r["measured"]["state_bytes_per_rank"]), r
assert whole[0]["parameters"] - vocab[0]["parameters"] == (151936 - 256) * 64 * 2, (whole[0]["parameters"], vocab[0]["parameters"])
assert (depth[0]["layers"], depth[0]["vision_layers"]) == (1, 1) and depth[0]["measured"]["step_peak_bytes"] > 0, depth[0]
# The step's peak is the largest of its three phases' (forward and loss, backward, update);
# the preflight (what is held and the largest of the step's moments) is not below the
# measured peak by more than 10 % (on these tiny models it is 1.14-1.44x the measured
# peak), nor are its forward's and backward's moments below those phases' peaks.
for r in whole + vocab + depth + lora:
    m, e = r["measured"], r["estimate"]
    phases = [m["forward_peak_bytes"], m["backward_peak_bytes"], m["update_peak_bytes"]]
    assert min(phases) > 0 and m["step_peak_bytes"] == max(phases), r
    assert m["step_peak_bytes"] <= 1.1 * e["total"], r
    moments = e["moments"]
    assert m["forward_peak_bytes"] <= 1.1 * max(moments["forward"], moments["loss"]), r
    backward = [v for k, v in moments.items() if "backward" in k or "reduction" in k]
    assert m["backward_peak_bytes"] <= 1.1 * max(backward), r
PY
$mmsp bench memory --model "$src/configs/tiny-qwen2-vl.json" --vocab 5 > "$work/bench-bad.log" 2>&1 && fail "bench memory --vocab 5 exited 0"
grep -q "vocab 5 cannot hold its 7 special token ids" "$work/bench-bad.log" ||
  fail "bench memory --vocab 5 did not name the value and the rule: $(tail -3 "$work/bench-bad.log")"
$mmsp bench memory --shard zero3 > "$work/bench-bad.log" 2>&1 && fail "bench memory --shard zero3 exited 0"
grep -q "zero3" "$work/bench-bad.log" || fail "bench memory --shard zero3 did not name the value: $(tail -3 "$work/bench-bad.log")"

# --- 6. The RL loop's trainer half (issue 72, docs/rl.md) ------------------------------
# Preference pairs of the examples' samples, the reference's sums from `mmsp logprobs` of the
# same model (so DPO's first loss is exactly ln 2), `mmsp train --objective dpo` on 2 ranks.
python3 - "$src/examples/data/data.jsonl" "$work/pairs.jsonl" <<'PY'
import json, sys
lines = [json.loads(t) for t in open(sys.argv[1])]
with open(sys.argv[2], "w") as f:
    for line in lines:
        worse = dict(line, input_ids=line["input_ids"][:-2] + [line["input_ids"][-2] + 1, line["input_ids"][-1]])
        f.write(json.dumps({"chosen": line, "rejected": worse}) + "\n")
PY
cp "$src"/examples/data/*.png "$work/"
rl=(--model "$src/configs/tiny-qwen2-vl.json" --dtype float64 --tokens-per-rank 256)
$run $mmsp logprobs "${rl[@]}" --data "$work/pairs.jsonl" --out "$work/ref.jsonl" > "$work/ref-lp.log" 2>&1 ||
  fail "mmsp logprobs of pairs: $(tail -5 "$work/ref-lp.log")"
python3 - "$work/pairs.jsonl" "$work/ref.jsonl" "$work/pairs-ref.jsonl" <<'PY' || fail "mmsp logprobs did not mark the pairs' sides"
import json, sys
pairs = [json.loads(t) for t in open(sys.argv[1])]
for r in map(json.loads, open(sys.argv[2])):
    assert r["side"] in ("chosen", "rejected") and abs(r["logps"] - sum(r["logprobs"])) < 1e-9, r
    pairs[r["pair"]]["ref_%s_logps" % r["side"]] = r["logps"]
open(sys.argv[3], "w").write("".join(json.dumps(p) + "\n" for p in pairs))
PY
$run $mmsp train "${rl[@]}" --data "$work/pairs-ref.jsonl" --objective dpo --steps 2 --warmup 1 --ulysses 2 \
  --out "$work/dpo" --quiet > "$work/dpo.log" 2>&1 || fail "mmsp train --objective dpo: $(tail -5 "$work/dpo.log")"
python3 - "$work/dpo/metrics.jsonl" <<'PY' || fail "DPO's first loss is not ln 2 with the policy as its reference"
import json, math, sys
first = json.loads(open(sys.argv[1]).readline())
assert abs(first["loss"] - math.log(2)) < 1e-12, first["loss"]
PY
# The same reference joined by --ref-logprobs (mmsp logprobs' file as it is): the same run.
$run $mmsp train "${rl[@]}" --data "$work/pairs.jsonl" --ref-logprobs "$work/ref.jsonl" --objective dpo --steps 2 \
  --warmup 1 --ulysses 2 --out "$work/dpo-join" --quiet > "$work/dpo-join.log" 2>&1 ||
  fail "--ref-logprobs: $(tail -5 "$work/dpo-join.log")"
$mmsp compare-losses "$work/dpo/metrics.jsonl" "$work/dpo-join/metrics.jsonl" > "$work/dpo-cmp.log" 2>&1 &&
  grep -q "2 common steps, largest relative difference 0 " "$work/dpo-cmp.log" ||
  fail "--ref-logprobs trains otherwise than the joined lines: $(cat "$work/dpo-cmp.log")"
head -4 "$work/ref.jsonl" > "$work/ref-cut.jsonl"
expect_exit2 ref_of_other_data "has no line for sample 4 of --data's 8: the file is of another --data" \
  train "${rl[@]}" --data "$work/pairs.jsonl" --objective dpo --steps 1 --ref-logprobs "$work/ref-cut.jsonl"
expect_exit2 grpo_no_advantages "advantages is missing: --objective grpo needs every sample's advantages" \
  train "${rl[@]}" --data "$src/examples/data/data.jsonl" --objective grpo --steps 1
expect_exit2 kl_without_objective "are read by an RL --objective" train "${rl[@]}" --kl-coef 0.1 --steps 1
# mmsp bench logprobs (docs/rl.md's figure at 32k tokens): every way's bytes are its formula,
# the values agree, and the naive way (the logits gathered) holds and sends more.
$run $mmsp bench logprobs --tokens 1024 --vocab 1024 --loss-chunk 64 --out "$work/bench-lp.json" \
  > "$work/bench-lp.log" 2>&1 || fail "bench logprobs: $(tail -5 "$work/bench-lp.log")"
python3 - "$work/bench-lp.json" <<'PY' || fail "bench logprobs: wrong figures"
import json, sys
d = json.load(open(sys.argv[1]))
assert [r["way"] for r in d["rows"]] == ["mmsp", "local-logits", "naive"], d
assert all(r["sent_bytes"] == r["formula_sent_bytes"] and r["max_abs_diff_from_mmsp"] < 1e-5 for r in d["rows"]), d
assert d["naive_over_mmsp_peak"] > 2 and d["naive_over_mmsp_sent"] > 100, d
PY

# --- 7. expert parallelism under ZeRO: save, resume on other degrees; bench experts -----
# Qwen3.5-MoE (tiny, 8 experts) on ring 2 with its experts split over both ranks. A run
# under --shard parameters saves at step 2 (each rank its experts' optimizer pieces, at
# their offsets in the whole tensors); resumed with --expert 2 --shard gradients and with
# --expert 1 --shard optimizer, both continue as the uninterrupted --shard none run did.
moe=(train --model "$src/configs/tiny-qwen3_5-moe.json" --steps 4 --tokens-per-rank 96 --dtype float64 --warmup 1
  --ring 2 --quiet)
$run $mmsp "${moe[@]}" --expert 2 --out "$work/moe-ref" > "$work/moe-ref.log" 2>&1 ||
  fail "moe reference: $(tail -5 "$work/moe-ref.log")"
$run $mmsp "${moe[@]}" --expert 2 --shard parameters --checkpoint-every 2 --out "$work/moe" > "$work/moe.log" 2>&1 ||
  fail "--expert 2 --shard parameters: $(tail -5 "$work/moe.log")"
$mmsp compare-losses "$work/moe-ref/metrics.jsonl" "$work/moe/metrics.jsonl" > "$work/moe-cmp.log" 2>&1 &&
  grep -Eq "4 common steps, largest relative difference (0|[0-9.]+e-1[0-9]) " "$work/moe-cmp.log" ||
  fail "--expert 2 --shard parameters trains otherwise than --shard none: $(cat "$work/moe-cmp.log")"
for resume in "2 gradients" "1 optimizer"; do
  set -- $resume
  d="$work/moe-resume-$1"
  mkdir -p "$d" && cp -r "$work/moe/step-000002" "$d/" && echo step-000002 > "$d/latest"
  head -2 "$work/moe/metrics.jsonl" > "$d/metrics.jsonl"
  $run $mmsp "${moe[@]}" --expert "$1" --shard "$2" --resume "$d" --out "$d" > "$d.log" 2>&1 ||
    fail "resume with --expert $1 --shard $2: $(tail -5 "$d.log")"
  $mmsp compare-losses "$work/moe-ref/metrics.jsonl" "$d/metrics.jsonl" > "$d-cmp.log" 2>&1 &&
    grep -Eq "4 common steps, largest relative difference (0|[0-9.]+e-1[0-9]) " "$d-cmp.log" ||
    fail "resumed with --expert $1 --shard $2, the losses differ: $(cat "$d-cmp.log")"
done
expect_error moe_resume_replicated "--resume with --expert 2 needs a --shard level" \
  "${moe[@]}" --expert 2 --resume "$work/moe" --out "$work/moe-none"
expect_error expert_on_dense "--expert 2 splits the experts of a mixture-of-experts model" train --expert 2 --ring 2
expect_error moe_tiled_mlp "--tiled-mlp is not supported for" "${moe[@]}" --tiled-mlp 16
expect_error expert_lora "--expert 2 with --freeze or --lora-rank is not supported yet" \
  "${moe[@]}" --expert 2 --lora-rank 4
# mmsp bench experts: every rank's bytes are the exact formula's, both routings; the skewed
# routing sends every row to rank 0.
$run $mmsp bench experts --model "$src/configs/tiny-qwen3-vl-moe.json" --tokens 32 --dtype float32 \
  --out "$work/bench-experts.json" > "$work/bench-experts.log" 2>&1 || fail "bench experts: $(tail -5 "$work/bench-experts.log")"
python3 - "$work/bench-experts.json" <<'PY' || fail "bench experts: wrong figures"
import json, sys
d = json.load(open(sys.argv[1]))
assert [r["routing"] for r in d["rows"]] == ["uniform", "skewed"], d
assert all(r["sent_bytes_per_rank"] == r["exact_formula_bytes_per_rank"] for r in d["rows"]), d
assert d["rows"][1]["busiest_over_mean_received"] == 2 and d["rows"][1]["rows_received_per_rank"][1] == 0, d
PY

if [ $failures -ne 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "train_cli: all checks passed"
