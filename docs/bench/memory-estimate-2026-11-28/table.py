#!/usr/bin/env python3
"""The estimate ÷ measured table of ../memory-estimate.md from the JSON beside this file."""
import json
import pathlib

here = pathlib.Path(__file__).parent
families = ["qwen2-vl", "qwen2_5-vl", "qwen3-vl", "qwen3_5-vl", "llava", "internvl"]
rows = None
table = {}
for family in families:
    for n in (1, 2, 4):
        data = json.loads((here / f"tiny-{family}-np{n}.json").read_text())
        names = []
        for r in data["rows"]:
            name = (f'{r["shard"]}, {r["checkpoint_activations"]}, chunk {r["loss_chunk"]}'
                    + (", tiled" if r["tiled_mlp"] != "off" else "")
                    + (", offload" if r["offload_activations"] else ""))
            names.append(name)
            table[(family, n, name)] = r["estimate"]["total"] / r["measured"]["step_peak_bytes"]
        rows = rows or names
print("| --shard, --checkpoint-activations, loss chunk | " + " | ".join(f"{f} 1 · 2 · 4" for f in families) + " |")
print("| --- |" + " --- |" * len(families))
for name in rows:
    cells = [" · ".join(f"{table[(f, n, name)]:.2f}" for n in (1, 2, 4)) for f in families]
    print(f"| {name} | " + " | ".join(cells) + " |")
ratios = list(table.values())
print(f"\n{len(ratios)} rows: {min(ratios):.3f} – {max(ratios):.3f}")
