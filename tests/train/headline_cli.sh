#!/bin/bash
# The README's headline at test size, as a user runs it (4 real ranks, the released
# Qwen3.5-0.8B config): docs/train.md measures the real one (32,768 tokens, an hour a
# step on a 2-core machine), this checks what can be checked in CI:
#  1. at 32,768 tokens the preflight refuses the run without the memory flags (≈ 30 GiB
#     a rank) and, with --shard parameters --checkpoint-activations all, estimates less
#     than a 24 GiB machine's quarter (6 GiB) — both before allocating anything;
#  2. the released architecture cut to 4 layers (3 Gated DeltaNet, 1 gated attention)
#     and a 4,096-word vocabulary, with its whole vision tower (hooked, run on no rows:
#     the data has no image), trains 2 bf16 steps on 4 ranks (Ulysses 4) with those flags.
#     32 tokens a rank: on a CPU without native bf16 (AVX2 only) LibTorch's bf16 matmul
#     runs ~80x slower than fp32 (0.38 against 30 GFLOP/s), and a step of 32 tokens takes
#     27 s there (256 tokens took 181 s a step and timed CI out).
# Usage: headline_cli.sh BUILD_DIR SOURCE_DIR
set -u
build=$1
src=$2
mmsp=$build/mmsp
run4="$build/mmsp-run -n 4 --"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
flags=(--shard parameters --checkpoint-activations all --loss-chunk 64)

python3 - "$src/configs/hf/Qwen3.5-0.8B.json" "$work" <<'PY' || { echo "FAIL: could not write the inputs"; exit 1; }
import json, random, sys
released, work = sys.argv[1], sys.argv[2]
random.seed(0)
with open(f"{work}/text32768.jsonl", "w") as f:
    f.write(json.dumps({"input_ids": [random.randrange(240000) for _ in range(32768)]}) + "\n")
config = json.load(open(released))
text = config["text_config"]
text["num_hidden_layers"] = 4
text["layer_types"] = text["layer_types"][:4]
vocab = 4096
text["vocab_size"] = vocab
next_id = vocab - 64  # special tokens moved into the smaller vocabulary
for level in (config, text):
    for key in sorted(level):
        if key.endswith("token_id") and isinstance(level[key], int) and level[key] >= vocab:
            level[key] = next_id
            next_id += 1
json.dump(config, open(f"{work}/q35-4l.json", "w"), indent=1)
with open(f"{work}/text128.jsonl", "w") as f:
    f.write(json.dumps({"input_ids": [random.randrange(vocab - 64) for _ in range(128)]}) + "\n")
PY

# --- 1. the preflight at 32k -----------------------------------------------------------
estimate() {  # estimate NAME ARGS...: the preflight's GiB per rank, from its refusal
  local name=$1
  shift
  timeout 300 $run4 $mmsp train --model "$src/configs/hf/Qwen3.5-0.8B.json" --data "$work/text32768.jsonl" \
    --ulysses 4 --dtype bfloat16 --tokens-per-rank 8192 --steps 1 --memory-limit 1GiB "$@" > "$work/$name.log" 2>&1
  local status=$?
  [ $status -eq 2 ] || { fail "$name: exit $status, not 2 (refused before allocating): $(tail -3 "$work/$name.log")" >&2; return; }
  for r in 0 1 2 3; do
    grep -q "\[rank $r\] .*needs about" "$work/$name.log" || fail "$name: rank $r gave no estimate" >&2
  done
  grep -m1 -o "needs about [0-9.]* GiB" "$work/$name.log" | grep -o "[0-9.]*"
}
plain=$(estimate plain)
sharded=$(estimate sharded "${flags[@]}")
python3 -c "import sys; sys.exit(0 if float('${plain:-0}') > 24 else 1)" \
  || fail "without the flags the 32k run should need more than 24 GiB a rank, the estimate says '${plain}'"
python3 -c "import sys; sys.exit(0 if 0 < float('${sharded:-0}') < 6 else 1)" \
  || fail "with the flags the 32k run should need less than 6 GiB a rank, the estimate says '${sharded}'"

# --- 2. the released architecture, test-sized, trains --------------------------------
timeout 500 $run4 $mmsp train --model "$work/q35-4l.json" --data "$work/text128.jsonl" --ulysses 4 \
  --dtype bfloat16 --tokens-per-rank 32 --steps 2 --warmup 1 "${flags[@]}" > "$work/train.log" 2>&1 \
  || fail "the 4-layer run failed: $(tail -5 "$work/train.log")"
grep -q "optimizer state, gradients and weights sharded\|sharded over 4" "$work/train.log" \
  || fail "the run did not say its state is sharded: $(grep -m1 'mmsp train:' "$work/train.log")"
for step in 1 2; do
  grep -q "\[rank 0\] step $step | loss [0-9]" "$work/train.log" || fail "no finite loss for step $step: $(tail -3 "$work/train.log")"
done

if [ $failures -ne 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "headline_cli: plain ${plain} GiB, sharded ${sharded} GiB a rank at 32k; the 4-layer model trained"
