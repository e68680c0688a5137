"""`mmsp prepare` under hostile input: every bad record ends in exit 2 naming its line (or is
skipped and listed with --skip-bad), never a traceback, never unbounded memory, and what
prepare writes `mmsp train` reads (the same bounds, the same numbers).

The tiny model directories and images are conftest.py's; the C++ reader is the build's
`mmsp pixels` (MMSP_BINARY), which reads a .jsonl exactly as `mmsp train` does.
"""
import json
import os
import re
import signal
import struct
import subprocess
import sys
import time
import zlib

import pytest

import tiny_models
from mmsp.prepare.errors import BadSample
from test_prepare import run

GOOD = {"text": "Hello there"}
IMAGE_RECORD = {"conversations": [{"from": "human", "value": "<image>\nWhat is this?"},
                                  {"from": "gpt", "value": "A cat."}], "image": "cat.png"}


def env():
    """The package conftest.py puts on the path, for `python -m mmsp.prepare` in a child."""
    package = os.environ.get("MMSP_PACKAGE_PATH") or os.path.join(tiny_models.REPO, "python")
    return dict(os.environ, PYTHONPATH=package, PYTHONDONTWRITEBYTECODE="1")


def listed(err, path):
    """{line: message} of the records --skip-bad listed."""
    return {int(k): v for k, v in re.findall(rf"^{re.escape(str(path))}:(\d+): (.*) \(skipped\)$", err, re.M)}


# --- hostile JSON ----------------------------------------------------------------------------

DEEP = 100_000


def hostile_records():
    """(raw JSON text of one record, what its error says; None: a good record)."""
    return [
        (json.dumps(GOOD), None),
        ("[" * DEEP + "]" * DEEP, "JSON nests deeper than 64 levels"),
        ('{"text": ' + "[" * DEEP + "]" * DEEP + "}", "JSON nests deeper than 64 levels"),
        ('{"text": "a cat \\ud800 sat"}', "text: the string holds a lone UTF-16 surrogate \\ud800 (at character 6)"),
        ('{"messages": [{"role": "user", "content": "\\udc00"}]}', "messages[0].content: the string holds a lone"),
        ('{"text": "one", "text": "two"}', 'the key "text" appears twice in one object (which one is meant?)'),
        ('{"messages": [{"role": "user", "content": "Hi", "role": "assistant"}]}', 'the key "role" appears twice'),
        ('{"text": NaN}', "invalid JSON: NaN is not a JSON number"),
        ('{"text": "x", "extra": ' + "[" * 64 + "]" * 64 + "}", "JSON nests deeper than 64 levels"),
        ('{"text": "the deepest allowed", "extra": ' + "[" * 63 + "]" * 63 + "}", None),  # 64 levels
        ('{"text": "a cat \\ud83d\\ude00 sat"}', None),  # a surrogate pair is one character
    ]


def test_hostile_json_lines_are_refused_by_line(capsys, models, folder):
    model_dir, _ = models["qwen2_vl"]
    entries = hostile_records()
    lines = [text + "\n" for text, _ in entries]
    rc, rows, err, path = run(capsys, model_dir, folder, lines)
    assert rc == 2 and not os.path.exists(folder / "out.jsonl"), err
    assert err.strip() == f"mmsp prepare: error: {path}:2: {entries[1][1]}; no mmsp input needs that many"
    rc, rows, err, path = run(capsys, model_dir, folder, lines, "--skip-bad")
    assert rc == 0, err
    bad = {k + 1: want for k, (_, want) in enumerate(entries) if want}
    got = listed(err, path)
    assert sorted(got) == sorted(bad), err
    for line, want in bad.items():
        assert want in got[line], (line, got[line])
    assert len(rows) == len(entries) - len(bad)


def test_hostile_records_of_a_json_list_are_named_by_the_line_they_start_on(capsys, models, folder):
    model_dir, _ = models["qwen2_vl"]
    entries = hostile_records()
    text, starts = "[\n", []
    for record, _ in entries:
        starts.append(text.count("\n") + 1)
        text += "  " + record + ",\n\n"
    text = text[:-3] + "\n]\n"
    rc, rows, err, path = run(capsys, model_dir, folder, [text], "--skip-bad", name="in.json")
    assert rc == 0, err
    got = listed(err, path)
    bad = {starts[k]: want for k, (_, want) in enumerate(entries) if want}
    assert sorted(got) == sorted(bad), err
    for line, want in bad.items():
        assert want in got[line], (line, got[line])
    assert len(rows) == len(entries) - len(bad)


def test_a_broken_json_list_still_stops_at_its_line(capsys, models, folder):
    model_dir, _ = models["qwen2_vl"]
    good = json.dumps(GOOD)
    for text, line, want in [
        (f"[\n{good},\n{good}\n", 3, "the list is not closed with ]"),
        (f"[\n{good},\n\n  {{\"text\": \"x\" \"y\"}}\n]", 4, "invalid JSON: Expecting ',' delimiter"),
        (f"[\n{good},\n]", 3, "expected a record before ]"),
        (f"[{good}] {good}", 1, "text after the closing ]"),
        (f'[\n{good}}}, {good}]', 2, "a } that closes nothing"),
    ]:
        rc, _, err, path = run(capsys, model_dir, folder, [text], "--skip-bad", name="in.json")
        assert rc == 2 and err.startswith(f"mmsp prepare: error: {path}:{line}: ") and want in err, (text, err)
    rc, rows, err, _ = run(capsys, model_dir, folder, ['\ufeff [ "a \\" ] , [", ' + good + " ]"], "--skip-bad",
                           name="in.json")
    assert rc == 0 and len(rows) == 1 and "a record must be a JSON object, not a string" in err, err


# --- the record size bound: memory --------------------------------------------------------------

HUGE = 9_000_000  # bytes of one text record: over the default --max-record-bytes (8 MiB)
MEASURE = ("import resource, runpy, sys\n"
           "sys.argv[0] = 'mmsp.prepare'\n"
           "try:\n"
           "    runpy.run_module('mmsp.prepare', run_name='__main__', alter_sys=True)\n"
           "except SystemExit as e:\n"
           "    code = e.code\n"
           "print(f'peak rss {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss} KiB', file=sys.stderr)\n"
           "sys.exit(code)\n")


def run_cli(model_dir, path, out, *flags):
    """mmsp prepare in this process on an input file: (exit code, None, stderr, path)."""
    import contextlib
    import io

    from mmsp.prepare import cli

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = cli.main(["--model", model_dir, "--input", str(path), "--output", str(out), *flags])
    return rc, None, err.getvalue(), path


def prepare_measured(model_dir, path, out, *flags):
    """(exit code, stderr, peak RSS in MiB) of `python -m mmsp.prepare` in a fresh process."""
    done = subprocess.run([sys.executable, "-c", MEASURE, "--model", model_dir, "--input", str(path), "--output",
                           str(out), *flags], env=env(), capture_output=True, text=True, timeout=600)
    peak = int(re.search(r"peak rss (\d+) KiB", done.stderr).group(1)) / 1024
    return done.returncode, done.stderr, peak


@pytest.mark.parametrize("form", ["lines", "list"])
def test_a_huge_record_is_refused_by_line_and_never_held(models, folder, form):
    """A 9 MB text record (one of 100 MB took 8 GB in the audit, more than 16 GB here, even with
    --max-length --overflow truncate) is a bad record by its size, read in pieces: the run's
    peak memory is that of a run without it, give or take the limit."""
    model_dir, _ = models["qwen2_vl"]
    words = ("a cat sat on the mat " * (HUGE // 21 + 1))[:HUGE]
    huge = json.dumps({"text": words})
    small = json.dumps({"text": words[:1000]})
    for name, middle in (("small", small), ("huge", huge)):
        path = folder / f"{name}.{'jsonl' if form == 'lines' else 'json'}"
        records = [json.dumps(GOOD), middle, json.dumps(GOOD)]
        path.write_text("\n".join(records) + "\n" if form == "lines" else "[\n" + ",\n".join(records) + "\n]\n")
    rc, err, baseline = prepare_measured(model_dir, path.with_name(path.name.replace("huge", "small")),
                                         folder / "small.out", "--max-length", "64", "--overflow", "truncate")
    assert rc == 0, err
    rc, err, peak = prepare_measured(model_dir, path, folder / "huge.out", "--max-length", "64", "--overflow",
                                     "truncate")
    assert rc == 2 and not os.path.exists(folder / "huge.out"), err
    size, line = len(huge), 2 if form == "lines" else 3
    assert (f"{path}:{line}: the record is {size:,} bytes, more than --max-record-bytes 8,388,608 (a record is held, "
            "rendered and tokenized whole in memory") in err, err
    rc, err, peak_skip = prepare_measured(model_dir, path, folder / "huge.out", "--skip-bad")
    assert rc == 0 and "wrote 2 samples" in err and "skipped 1 bad record" in err, err
    # The limit's worth of bytes is read at most once at a time (lines: one readline of it).
    for p in (peak, peak_skip):
        assert p - baseline < 64, f"peak RSS {p:.0f} MiB against {baseline:.0f} MiB without the huge record"
    # The bound is the flag's.
    small_path = path.with_name(path.name.replace("huge", "small"))
    rc, _, err, _ = run_cli(model_dir, small_path, folder / "small.out", "--max-record-bytes", "1000")
    assert rc == 2 and f"{small_path}:{line}: the record is {len(small):,} bytes, more than --max-record-bytes 1,000" \
        in err, err
    rc, _, err, _ = run_cli(model_dir, small_path, folder / "small.out", "--max-record-bytes", str(len(small)))
    assert rc == 0 and "wrote 3 samples" in err, err


# --- images: decompression bombs and the trainer's pixel bound --------------------------------------

def png(path, width, height, rows=None):
    """A PNG of width x height RGB pixels: `rows` of zeros compressed (a real image), or, with
    rows=None, a few bytes of data behind a header that declares the size (a bomb's trick)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    z = zlib.compressobj(9)
    row = b"\0" * (1 + 3 * width)
    data = z.compress(row * 4) if rows is None else b"".join(z.compress(row) for _ in range(rows))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data + z.flush()) +
                     chunk(b"IEND", b""))


def image_record(name):
    return dict(IMAGE_RECORD, image=name)


def test_decompression_bombs_and_oversized_images_are_refused_by_line(capsys, models, folder):
    model_dir, _ = models["qwen2_vl"]
    png(folder / "declared.png", 100_000, 100_000)  # 10^10 pixels declared in a 100-byte file
    png(folder / "warned.png", 10_000, 10_000, rows=10_000)  # PIL's DecompressionBombWarning range
    png(folder / "tall.png", 1, 2 ** 24 + 1)  # a side stb_image does not read (with the limit raised)
    over = 4100  # 4100 x 4100 = 16,810,000 > 2^24 pixels: mmsp train's default refuses it
    png(folder / "over.png", over, over, rows=over)
    png(folder / "limit.png", 4096, 4096, rows=4096)  # exactly 2^24: taken
    records = [image_record(n) for n in ("declared.png", "warned.png", "over.png", "limit.png", "tall.png")]
    rc, rows, err, path = run(capsys, model_dir, folder, records, "--skip-bad")
    assert rc == 0, err
    got = listed(err, path)
    assert sorted(got) == [1, 2, 3, 5], err
    for line, name, w, h in [(1, "declared.png", 100_000, 100_000), (2, "warned.png", 10_000, 10_000),
                             (3, "over.png", over, over), (5, "tall.png", 1, 2 ** 24 + 1)]:
        assert got[line] == (f'image 0 file "{folder / name}" is {w} x {h} = {w * h} pixels, more than '
                             f"--max-image-pixels 16777216 (decoded it would take {w * h * 3 // 2 ** 20} MiB as RGB); "
                             "shrink it or raise the limit (mmsp train needs the same --max-image-pixels)"), got[line]
    assert len(rows) == 1 and rows[0]["images"] == [{"path": "limit.png"}]
    rc, rows, err, path = run(capsys, model_dir, folder, records[2:], "--skip-bad", "--max-image-pixels",
                              str(2 ** 31))
    assert rc == 0 and len(rows) == 2, err
    assert listed(err, path) == {3: f'image 0 file "{folder / "tall.png"}" is 1 x {2 ** 24 + 1} pixels: a side over '
                                    f"{2 ** 24} is more than mmsp's image reader (stb_image) reads"}, err
    for value in ("0", str(2 ** 31 + 1)):
        rc, _, err, _ = run(capsys, model_dir, folder, records[3:4], "--max-image-pixels", value)
        assert rc == 2 and f"--max-image-pixels {value} must be in [1, 2147483648]" in err, err


# --- what prepare writes, mmsp train reads ----------------------------------------------------------

def cpp_reads(model_dir, data, tmp_path, *flags):
    """`mmsp pixels` on `data` (mmsp train's .jsonl reader and its checks): (exit code, output)."""
    binary = os.environ.get("MMSP_BINARY")
    if not binary:
        pytest.skip("MMSP_BINARY (the build's mmsp) is not set: ctest sets it")
    config = os.path.join(model_dir, "config.json")  # the tiny directories hold no weights
    done = subprocess.run([binary, "pixels", "--model", config, "--data", str(data), "--out",
                           str(tmp_path / "px.safetensors"), "--count", "0", *flags], capture_output=True, text=True)
    return done.returncode, done.stdout + done.stderr


def test_what_prepare_writes_mmsp_train_reads(capsys, models, folder, tmp_path):
    """Every family's output, and images at the trainer's pixel bound, read by the C++ reader;
    an image past it is refused by both, with the same number."""
    png(folder / "limit.png", 4096, 4096, rows=4096)
    png(folder / "over.png", 4100, 4100, rows=4100)
    for family in tiny_models.FAMILIES:
        model_dir, _ = models[family]
        records = [IMAGE_RECORD, image_record("big.png"), GOOD, image_record("limit.png"), image_record("over.png")]
        rc, rows, err, _ = run(capsys, model_dir, folder, records, "--skip-bad", output=f"{family}.jsonl")
        assert rc == 0 and len(rows) == 4 and "more than --max-image-pixels 16777216" in err, err
        rc, out = cpp_reads(model_dir, folder / f"{family}.jsonl", tmp_path)
        assert rc == 0, f"{family}: mmsp train refuses what mmsp prepare wrote: {out}"
    # Past the bound: prepare takes it only with the limit raised, and so does the trainer.
    model_dir, _ = models["qwen2_vl"]
    rc, rows, err, _ = run(capsys, model_dir, folder, [image_record("over.png")], "--max-image-pixels", "16810000")
    assert rc == 0, err
    rc, out = cpp_reads(model_dir, folder / "out.jsonl", tmp_path)
    assert rc != 0 and "is 4100 x 4100 = 16810000 pixels, more than --max-image-pixels 16777216" in out, out
    rc, out = cpp_reads(model_dir, folder / "out.jsonl", tmp_path, "--max-image-pixels", "16810000")
    assert rc == 0, out


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5"])
def test_video_files_prepare_writes_mmsp_train_decodes_as_transformers(capsys, models, folder, tmp_path, family):
    """A video file through the whole chain: prepare's {"path", "frame_indices"} line, decoded by
    mmsp train's reader (`mmsp pixels`), gives the pixel_values_videos transformers gives for the
    same file with its own sampling (the in-memory processor, given the path)."""
    import copy

    import torch
    from safetensors.torch import load_file

    from test_prepare import assistant, clip_records, reference_video, text, user, write_clip

    binary = os.environ.get("MMSP_BINARY")
    if not binary:
        pytest.skip("MMSP_BINARY (the build's mmsp) is not set: ctest sets it")
    model_dir, processor = models[family]
    write_clip(folder / "clip.mp4", width=70, height=58)  # sides no multiple of 32: FFmpeg's filter graph
    rc, rows, err, _ = run(capsys, model_dir, folder, clip_records(folder)[:1], output="video.jsonl")
    assert rc == 0, err
    done = subprocess.run([binary, "pixels", "--model", os.path.join(model_dir, "config.json"), "--data",
                           str(folder / "video.jsonl"), "--out", str(tmp_path / "px.safetensors")],
                          capture_output=True, text=True)
    assert done.returncode == 0, f"mmsp train refuses what mmsp prepare wrote: {done.stdout + done.stderr}"
    messages = [user({"type": "video", "video": str(folder / "clip.mp4")}, text("What moves?")), assistant("A dog.")]
    want = reference_video(processor, copy.deepcopy(messages))["pixel_values_videos"]
    got = load_file(str(tmp_path / "px.safetensors"))["sample0.video0"]
    assert got.shape == want.shape, (tuple(got.shape), tuple(want.shape))
    assert torch.equal(got, want.to(got.dtype)), f"off by up to {(got - want).abs().max().item():.3e}"


def test_the_bounds_are_the_trainers_numbers():
    """train_bounds.py restates the C++ constants (prepare runs without the build): each equals its source."""
    from mmsp.prepare import train_bounds

    def source(path):
        with open(os.path.join(tiny_models.REPO, path), encoding="utf-8") as f:
            return f.read()

    def number(path, pattern):
        m = re.search(pattern, source(path))
        assert m, f"{path}: no match for {pattern!r}: update train_bounds.py and this test together"
        return eval(m.group(1).replace("int64_t{1}", "1"))  # "1 << 24", "int64_t{1} << 31", "1e4"

    assert train_bounds.MAX_JSON_DEPTH == number("include/mmsp/core/json_read.h", r"kMaxJsonDepth = (\d+);")
    assert train_bounds.MAX_IMAGE_PIXELS == number("include/mmsp/train/train_options.h",
                                                   r"int64_t max_image_pixels = (\d+);")
    assert train_bounds.MAX_IMAGE_PIXELS == number("src/cli/pixels_command.cpp",
                                                   r"int64_t max_image_pixels = ([^;]+);")
    assert train_bounds.MAX_IMAGE_PIXELS_BOUND == number("include/mmsp/train/run_checks.h",
                                                         r"kMaxImagePixelsBound = ([^;]+);")
    assert train_bounds.MAX_SECONDS_PER_GRID == number("include/mmsp/plan/model_conventions.h",
                                                       r"kMaxSecondsPerGrid = ([^;]+);")
    assert train_bounds.INT32_MAX == 2 ** 31 - 1 and "std::numeric_limits<int32_t>::max()" in source(
        "src/plan/sequence.cpp")
    assert "STBI_MAX_DIMENSIONS" not in source("src/train/data/image_file.cpp")  # stb's default, then:
    stb = "/usr/include/stb/stb_image.h"
    if os.path.exists(stb):
        assert train_bounds.STB_MAX_DIMENSION == number(stb, r"#define STBI_MAX_DIMENSIONS \(([^)]+)\)")


def test_seconds_per_grid_beyond_the_trainers_bound_are_refused(models):
    """Qwen2.5-VL's second_per_grid_ts is temporal_patch_size / --video-fps: a frame rate so low
    that it passes 1e4 s would be refused by mmsp train."""
    from mmsp.prepare import model as model_dir
    from mmsp.prepare import run as prepare_run

    model = model_dir.load(models["qwen2_5_vl"][0])
    line = {"input_ids": [1, 2], "loss_mask": [0, 1], "video_grid_thw": [[1, 2, 2]], "second_per_grid_ts": [2e4]}
    with pytest.raises(BadSample, match=r"second_per_grid_ts\[0\] is 20000.0, outside \[0, 10000\] seconds"):
        prepare_run._check_train_bounds(model, line)
    line["second_per_grid_ts"] = [1e4]
    prepare_run._check_train_bounds(model, line)
    line["video_grid_thw"] = [[1, 3, 2]]
    with pytest.raises(BadSample, match=r"divisible by spatial_merge_size 2"):
        prepare_run._check_train_bounds(model, line)


# --- video frames, the model's config, what a template drops or reads as control ----------------

def _model_copy(models, family, tmp_path, change):
    """A copy of the family's tiny model directory with `change(files)` applied to its JSON files
    (files: name -> parsed content, written back as JSON, or a str written as it is)."""
    import shutil

    folder = tmp_path / f"{family}-changed-{len(list(tmp_path.glob('*-changed-*')))}"
    shutil.copytree(models[family][0], folder)
    files = {name: json.loads((folder / name).read_text()) for name in ("config.json", "processor_config.json")}
    change(files)
    for name, content in files.items():
        (folder / name).write_text(content if isinstance(content, str) else json.dumps(content))
    return str(folder)


def test_video_frame_counts_are_bounded_before_any_record(capsys, models, folder, tmp_path):
    """--video-num-frames (or the config's num_frames) at most max_frames (the flag's or the
    config's), and at most 2^31 - 1: refused before any record is read. Qwen3-VL's sampler makes
    num_frames indices whatever the file holds (10^9 grew to 6 GB in 21 s; 2^63 was a traceback)."""
    from test_prepare import clip_records, write_clip

    write_clip(folder / "clip.mp4")
    qwen3 = models["qwen3_vl"][0]

    def video_config(**fields):
        return _model_copy(models, "qwen3_vl", tmp_path, lambda f: f["processor_config.json"]["video_processor"]
                           .update(fields))

    cases = [
        (qwen3, ["--video-num-frames", "1000000000"],
         f'--video-num-frames 1000000000 is above max_frames 768 in the video processor config of --model "{qwen3}": '
         "a video is sampled to at most max_frames frames"),
        (qwen3, ["--video-num-frames", str(2 ** 63)],
         f"--video-num-frames {2 ** 63} is more frames than one video of mmsp train holds: at most 2147483647"),
        (qwen3, ["--video-num-frames", "100", "--video-max-frames", "50"],
         "--video-num-frames 100 is above --video-max-frames 50: a video is sampled to at most max_frames frames"),
        (video_config(num_frames=10 ** 9, fps=None), [], "num_frames 1000000000 in the video processor config of "
                                                         "--model"),
        (video_config(max_frames=None), ["--video-num-frames", "8"], "sets no max_frames, which bounds the frames a "
                                                                     "video is sampled to; give --video-max-frames"),
    ]
    for model_dir, flags, words in cases:
        rc, _, err, _ = run(capsys, model_dir, folder, clip_records(folder)[:1], *flags)
        assert rc == 2 and err.startswith("mmsp prepare: error: ") and words in err, (flags, err)
    rc, rows, err, _ = run(capsys, qwen3, folder, clip_records(folder)[:1], "--video-num-frames", "50",
                           "--video-max-frames", "50")
    assert rc == 0 and len(rows[0]["videos"][0]["frame_indices"]) == 50, err  # raised: Qwen3-VL repeats frames


def test_a_hostile_model_config_is_refused_without_a_traceback(capsys, models, folder, tmp_path):
    """The model's config.json is read by the records' JSON rules (depth, repeated keys, size)."""
    def deep(f):
        f["config.json"] = json.dumps(f["config.json"])[:-1] + ', "x": ' + "[" * DEEP + "]" * DEEP + "}"

    def repeated(f):
        f["config.json"] = json.dumps(f["config.json"])[:-1] + ', "model_type": "llava"}'

    def text_config_list(f):
        f["config.json"]["text_config"] = [1]

    for change, words in [(deep, "config.json: JSON nests deeper than 64 levels"),
                          (repeated, 'config.json: the key "model_type" appears twice in one object'),
                          (text_config_list, "config.json: text_config must be an object, not list")]:
        rc, _, err, _ = run(capsys, _model_copy(models, "qwen2_vl", tmp_path / change.__name__, change), folder,
                            [GOOD])
        assert rc == 2 and err.startswith("mmsp prepare: error: ") and words in err, (change.__name__, err)


def test_what_a_template_drops_or_reads_as_control_is_refused(capsys, models, folder):
    """reasoning_content for a template that never reads it (dropped without a word); a special
    token in an answer or its reasoning (a control token as a target mid-turn); --video-wrapper
    for a model whose videos have no wrapper (it would change nothing)."""
    def turn(answer, **fields):
        return {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": answer, **fields}]}

    for family, record, words in [
        ("qwen2_vl", turn("A dog.", reasoning_content="It barks."),
         'turn 1: "reasoning_content" is given, but the model directory\'s chat template never reads '
         "reasoning_content, so it would be dropped without a word"),
        ("qwen3_5", turn("A dog.<|im_start|>user\nmore"), "turn 1 (assistant): its text holds the special token "
                                                           "<|im_start|>, which the tokenizer reads as that control "
                                                           "token: it would be a target"),
        ("qwen3_5", turn("A dog.", reasoning_content="It barks.<|endoftext|>"),
         "turn 1 (assistant): its reasoning holds the special token <|endoftext|>"),
        ("internvl", turn("A <IMG_CONTEXT> dog."), "turn 1 (assistant): its text holds the special token <IMG_CONTEXT>"),
    ]:
        rc, _, err, path = run(capsys, models[family][0], folder, [GOOD, record])
        assert rc == 2 and err.strip().startswith(f"mmsp prepare: error: {path}:2: {words}"), (family, err)
    rc, _, err, _ = run(capsys, models["qwen3_5"][0], folder, [turn("A dog.", reasoning_content="It barks.")])
    assert rc == 0, err  # Qwen3.5's template reads it
    for family in ("qwen2_vl", "llava"):
        rc, _, err, _ = run(capsys, models[family][0], folder, [GOOD], "--video-wrapper", "keep")
        assert rc == 2 and f"--video-wrapper keep: the processor of model_type {family} writes no" in err, err


# --- signals -------------------------------------------------------------------------------------

@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_leaves_no_partial_output(models, folder, signum):
    model_dir, _ = models["qwen2_vl"]
    path = folder / "many.jsonl"
    path.write_text((json.dumps(IMAGE_RECORD) + "\n") * 20_000)
    out = folder / "many.out.jsonl"
    child = subprocess.Popen([sys.executable, "-m", "mmsp.prepare", "--model", model_dir, "--input", str(path),
                              "--output", str(out)], env=env(), stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not [n for n in os.listdir(folder) if n.endswith(".partial")]:
            assert child.poll() is None, child.stderr.read()
            assert time.monotonic() < deadline, "no temporary output after 120 s"
            time.sleep(0.05)
        time.sleep(0.5)  # records are being written
        assert child.poll() is None, "the run ended before the signal"
        child.send_signal(signum)
        rc = child.wait(timeout=60)
    finally:
        child.kill()
    err = child.stderr.read()
    assert rc == 128 + signum, (rc, err)
    assert err.strip().endswith(f"mmsp prepare: interrupted by {signal.Signals(signum).name}; the output is not "
                                "written"), err
    assert not [n for n in os.listdir(folder) if n.endswith(".partial")] and not out.exists()


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 1 << 20])
def test_the_list_reader_splits_records_as_json_does(tmp_path, monkeypatch, chunk):
    """The JSON list is read in chunks (1 MiB; here down to 1 byte, so that every string, escape,
    bracket and comma falls across a chunk's end somewhere): each record and its first line as
    json.loads and the text give them."""
    import random

    from mmsp.prepare import reader

    monkeypatch.setattr(reader, "_CHUNK", chunk)
    rng = random.Random(chunk)
    pieces = ['a', '"', '\\', ',', '[', ']', '{', '}', ' ', '\n', 'é', '\u2028', '\\"', '😀']

    def value(depth):
        kind = rng.randrange(6 if depth < 4 else 3)
        if kind == 0:
            return "".join(rng.choice(pieces) for _ in range(rng.randrange(8)))
        if kind == 1:
            return rng.choice([0, -1.5, True, None, 10 ** 20])
        if kind == 2:
            return "x"
        if kind == 3:
            return [value(depth + 1) for _ in range(rng.randrange(4))]
        return {f"k{i}{rng.choice(pieces)}": value(depth + 1) for i in range(rng.randrange(4))}

    records = [{"text": value(0), "n": k, "more": value(1)} for k in range(40)]
    text, starts = "\ufeff[", []
    for k, r in enumerate(records):
        text += rng.choice(["", " ", "\n", "\n\n  "])
        starts.append(text.count("\n") + 1)
        text += json.dumps(r, indent=rng.choice([None, 1]), ensure_ascii=rng.random() < 0.5)
        text += rng.choice(["", "\n", " "]) + ("," if k < len(records) - 1 else "\n]\n")
    path = tmp_path / "in.json"
    path.write_text(text, encoding="utf-8")
    got = list(reader.read_records(str(path), 1 << 20))
    assert [line for line, _ in got] == starts
    assert [record for _, record in got] == records
