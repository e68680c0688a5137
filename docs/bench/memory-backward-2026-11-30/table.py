#!/usr/bin/env python3
"""The estimate ÷ measured table of ../memory-estimate.md from the tiny-*-np*.json in a
folder (this file's, or the one named as the argument), and, where the rows carry them,
the same by phase: the forward and loss, the backward, the update (each phase's measured
peak against the largest of its moments, held part included)."""
import json
import pathlib
import sys

here = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else pathlib.Path(__file__).parent
families = ["qwen2-vl", "qwen2_5-vl", "qwen3-vl", "qwen3_5-vl", "llava", "internvl"]
phases = {
    "forward": (lambda m: max(m["forward"], m["loss"]), "forward_peak_bytes"),
    "backward": (lambda m: max(v for k, v in m.items() if "backward" in k or "reduction" in k), "backward_peak_bytes"),
    "update": (lambda m: m["update"], "update_peak_bytes"),
}
rows = None
table = {}
by_phase = {p: [] for p in phases}
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
            for phase, (estimate, measured) in phases.items():
                if "moments" not in r["estimate"]:  # rows of before 2026-11-30
                    continue
                by_phase[phase].append((estimate(r["estimate"]["moments"]) / r["measured"][measured], family, n, name))
        rows = rows or names
print("| --shard, --checkpoint-activations, loss chunk | " + " | ".join(f"{f} 1 · 2 · 4" for f in families) + " |")
print("| --- |" + " --- |" * len(families))
for name in rows:
    cells = [" · ".join(f"{table[(f, n, name)]:.2f}" for n in (1, 2, 4)) for f in families]
    print(f"| {name} | " + " | ".join(cells) + " |")
ratios = list(table.values())
print(f"\n{len(ratios)} rows: {min(ratios):.3f} – {max(ratios):.3f}")
for phase, values in by_phase.items():
    if not values:
        continue
    lo, hi = min(values), max(values)
    print(f"{phase}: {lo[0]:.3f} ({lo[1]} np{lo[2]}, {lo[3]}) – {hi[0]:.3f} ({hi[1]} np{hi[2]}, {hi[3]})")
