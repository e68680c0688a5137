"""`mmsp report RUN_DIR [RUN_DIR...] [--out PREFIX]` (python -m mmsp.report): the curves of
one or more `mmsp train --out` runs, read from their metrics.jsonl (the steps' rows and the
evaluations' rows, docs/metrics.md), drawn with matplotlib into PREFIX.png and an HTML page
PREFIX.html (the picture and each run's figures), the runs overlaid: training loss, eval
loss, learning rate, peak memory and tokens/s against the step."""

from __future__ import annotations

import argparse
import base64
import html
import json
import math
import os
import sys
from typing import Any

PANELS = [  # (title, the row's key, its kind: "step" or "eval", scale)
    ("loss", "loss", "step", 1.0),
    ("eval loss", "eval_loss", "eval", 1.0),
    ("learning rate", "lr", "step", 1.0),
    ("peak memory (MiB)", "peak_bytes", "step", 1.0 / 2**20),
    ("tokens/s", "tokens_per_s", "step", 1.0),
]


def read_run(run_dir: str) -> dict[str, list[dict[str, Any]]]:
    """A run's rows: {"step": [...], "eval": [...]}, the last row of a repeated step winning (a
    resumed run appends again from its first step). Errors name the file and the line."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise ValueError(f"{run_dir}: no metrics.jsonl (give the --out directory of an mmsp train run)")
    steps: dict[int, dict[str, Any]] = {}
    evals: dict[int, dict[str, Any]] = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                step = int(row["step"])
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{number}: not a metrics line ({e})") from None
            if "eval_loss" in row:
                evals[step] = row
            else:
                seconds = float(row.get("seconds") or 0)
                row["tokens_per_s"] = row.get("tokens", 0) / seconds if seconds > 0 else math.nan
                steps[step] = row
    if not steps and not evals:
        raise ValueError(f"{path}: holds no step")
    return {"step": [steps[s] for s in sorted(steps)], "eval": [evals[s] for s in sorted(evals)]}


def _value(row: dict[str, Any], key: str, scale: float) -> float:
    v = row.get(key)
    return math.nan if v is None else float(v) * scale


def draw(runs: dict[str, dict[str, list[dict[str, Any]]]], png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(4.2 * len(PANELS), 3.6))
    for ax, (title, key, kind, scale) in zip(axes, PANELS):
        for label, rows in runs.items():
            points = [(r["step"], _value(r, key, scale)) for r in rows[kind]]
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, marker="o" if kind == "eval" else None, markersize=3, label=label)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def page(runs: dict[str, dict[str, list[dict[str, Any]]]], png: str) -> str:
    with open(png, "rb") as f:
        picture = base64.b64encode(f.read()).decode("ascii")
    rows = []
    for label, r in runs.items():
        last = r["step"][-1] if r["step"] else {}
        last_eval = r["eval"][-1]["eval_loss"] if r["eval"] else None
        rows.append(f"<tr><td>{html.escape(label)}</td><td>{len(r['step'])}</td><td>{last.get('loss', '')}</td>"
                    f"<td>{'' if last_eval is None else last_eval}</td>"
                    f"<td>{max((x.get('peak_bytes', 0) for x in r['step']), default=0) / 2**20:.1f}</td></tr>")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>mmsp report</title></head><body>"
            "<h1>mmsp report</h1>"
            f"<img alt='loss, eval loss, learning rate, peak memory, tokens/s' src='data:image/png;base64,{picture}'>"
            "<table border='1' cellpadding='4'><tr><th>run</th><th>steps</th><th>last loss</th>"
            "<th>last eval loss</th><th>peak MiB</th></tr>" + "".join(rows) + "</table></body></html>\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mmsp report", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="--out directories of mmsp train runs")
    parser.add_argument("--out", default="report", help="PREFIX of PREFIX.png and PREFIX.html (default: report)")
    args = parser.parse_args(argv)
    try:
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for d in args.runs:
            label = os.path.basename(os.path.normpath(d)) or d
            while label in runs:
                label += "'"
            runs[label] = read_run(d)
        png, page_path = args.out + ".png", args.out + ".html"
        os.makedirs(os.path.dirname(os.path.abspath(png)), exist_ok=True)
        draw(runs, png)
        with open(page_path, "w", encoding="utf-8") as f:
            f.write(page(runs, png))
    except ValueError as e:
        print(f"mmsp report: error: {e}", file=sys.stderr)
        return 2
    print(f"mmsp report: wrote {png} and {page_path} ({len(runs)} run{'s' if len(runs) > 1 else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
