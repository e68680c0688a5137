"""What a run writes for people to look at: `mmsp train --out`'s TensorBoard event files, read
back by tensorboard's own reader (tensorboard 2.21, requirements/hf.txt) against the run's
metrics.jsonl, and `mmsp report`'s PNG and HTML of a 1-rank and a 2-rank run overlaid (the
demo's picture). The binaries come from MMSP_BINARY (mmsp-run beside it)."""
import base64
import json
import os
import subprocess

import pytest

BINARY = os.environ.get("MMSP_BINARY", "")
pytestmark = pytest.mark.skipif(not BINARY, reason="MMSP_BINARY (the mmsp tool) is not set")


def train(out, ranks, *extra):
    """4 steps of the built-in model on `ranks` ranks (the same batches whatever the ranks)."""
    run = os.path.join(os.path.dirname(BINARY), "mmsp-run")
    cmd = ([run, "-n", str(ranks), "--"] if ranks > 1 else []) + [
        BINARY, "train", "--steps", "4", "--warmup", "1", "--tokens-per-rank", str(128 // ranks), "--out", str(out),
        "--memory-limit", "0", *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def eval_file(path):
    """Six text samples of the built-in model's words (ids 3..100)."""
    with open(path, "w", encoding="utf-8") as f:
        for k in range(6):
            f.write(json.dumps({"input_ids": [1] + [3 + (k * 7 + j * 3) % 97 for j in range(12 + k)] + [2]}) + "\n")
    return str(path)


def rows(out):
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def test_tensorboard_files_read_back_with_tensorboards_reader(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    log = train(out, 1, "--eval-data", eval_file(tmp_path / "eval.jsonl"), "--eval-every", "2", "--peak-tflops", "1")
    assert " | 4/4 | ETA 0m00s | " in log and "MFU" in log, log
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "train/peak_mib", "train/sent_mib",
            "eval/loss"} <= tags, tags
    steps = [r for r in rows(out) if "eval_loss" not in r]
    evals = [r for r in rows(out) if "eval_loss" in r]
    assert [e.step for e in events.Scalars("train/loss")] == [r["step"] for r in steps]
    for e, r in zip(events.Scalars("train/loss"), steps):
        assert e.value == pytest.approx(r["loss"], rel=1e-6)  # float32 in the file
    for e, r in zip(events.Scalars("train/lr"), steps):
        assert e.value == pytest.approx(r["lr"], rel=1e-6)
    assert [(e.step, pytest.approx(e.value, rel=1e-6)) for e in events.Scalars("eval/loss")] == \
        [(r["step"], r["eval_loss"]) for r in evals]
    assert [r["step"] for r in evals] == [2, 4]


def test_report_draws_a_1_rank_and_a_2_rank_run(tmp_path):
    import matplotlib.image

    one, two = tmp_path / "1-rank", tmp_path / "2-ranks"
    train(one, 1)
    train(two, 2)
    done = subprocess.run([BINARY, "report", str(one), str(two), "--out", str(tmp_path / "report")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    picture = matplotlib.image.imread(str(tmp_path / "report.png"))
    assert picture.shape[0] > 200 and picture.shape[1] > 1000, picture.shape
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert base64.b64encode((tmp_path / "report.png").read_bytes()).decode() in page
    assert "1-rank" in page and "2-ranks" in page
    bad = subprocess.run([BINARY, "report", str(tmp_path / "none")], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "no metrics.jsonl" in bad.stderr, bad.stderr
