"""`mmsp prepare` against transformers' own processors, for every family mmsp trains.

The reference is the processor the test builds in memory (tiny_models.py): its
`apply_chat_template(messages, tokenize=True)` on the same conversation, given the image
and video file paths to load itself (videos: mp4s written here by torchcodec's encoder).
mmsp prepare reads the saved model directory and the input records.
"""
import copy
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

import tiny_models
from conftest import IMAGES
from mmsp.prepare import cli

QWEN = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5", "qwen3_vl_moe", "qwen3_5_moe"]


# --- helpers -----------------------------------------------------------------------------------

def run(capsys, model, folder, records, *flags, name="in.jsonl", output="out.jsonl"):
    """Writes `records` (objects, or raw text lines) to FOLDER/NAME and runs mmsp prepare in this
    process; returns (exit code, the output's rows (None when it failed), stderr, input path)."""
    path = folder / name
    path.write_text("".join(r if isinstance(r, str) else json.dumps(r) + "\n" for r in records))
    out = folder / output
    rc = cli.main(["--model", model, "--input", str(path), "--output", str(out), *flags])
    err = capsys.readouterr().err
    rows = [json.loads(line) for line in out.read_text().splitlines()] if rc == 0 else None
    return rc, rows, err, path


def text(t):
    return {"type": "text", "text": t}


def image(folder, name):
    return {"type": "image", "image": str(folder / name)}


def user(*parts):
    return {"role": "user", "content": list(parts)}


def assistant(t):
    return {"role": "assistant", "content": [text(t)]}


def runs(ids, mask):
    """The masked tokens, as runs of consecutive targets."""
    out, current = [], []
    for t, m in zip(ids, mask):
        if m:
            current.append(t)
        elif current:
            out.append(current)
            current = []
    return out + ([current] if current else [])


def cases(folder):
    """(input record, the same conversation as transformers' messages, image files in order)."""
    return [
        # LLaVA format, one image.
        ({"conversations": [{"from": "human", "value": "<image>\nWhat is this?"}, {"from": "gpt", "value": "A cat."}],
          "image": "cat.png"},
         [user(image(folder, "cat.png"), text("What is this?")), assistant("A cat.")],
         ["cat.png"]),
        # OpenAI messages: a system turn, two images in one turn, two rounds.
        ({"messages": [{"role": "system", "content": "You are a helpful assistant."},
                       {"role": "user", "content": [{"type": "text", "text": "Compare the two images."},
                                                    {"type": "image", "image": "dog.png"},
                                                    {"type": "image", "image": "big.png"}]},
                       {"role": "assistant", "content": "The first is larger than the second."},
                       {"role": "user", "content": [{"type": "text", "text": "Hello there"},
                                                    {"type": "image", "image": "small.png"}]},
                       {"role": "assistant", "content": [{"type": "text", "text": "Fine, thanks."}]}]},
         [{"role": "system", "content": [text("You are a helpful assistant.")]},
          user(text("Compare the two images."), image(folder, "dog.png"), image(folder, "big.png")),
          assistant("The first is larger than the second."),
          user(text("Hello there"), image(folder, "small.png")), assistant("Fine, thanks.")],
         ["dog.png", "big.png", "small.png"]),
        # ShareGPT: string contents with markers, the images at the top level.
        ({"messages": [{"role": "user", "content": "<image>Describe the picture."},
                       {"role": "assistant", "content": "A red square on a grey background."}],
          "images": ["tall.png"]},
         [user(image(folder, "tall.png"), text("Describe the picture.")),
          assistant("A red square on a grey background.")],
         ["tall.png"]),
        # No image.
        ({"conversations": [{"from": "human", "value": "Hello there, how are you today?"},
                            {"from": "gpt", "value": "Fine, thanks."}]},
         [user(text("Hello there, how are you today?")), assistant("Fine, thanks.")],
         []),
    ]


def expected_targets(family, messages):
    """What each assistant turn's targets decode to, written out per template."""
    answers = [m["content"][0]["text"] for m in messages if m["role"] == "assistant"]
    if family == "llava":
        # Its {% generation %} block is content['text'] + ' ', and Llama's tokenizer puts a
        # blank with the word after it: only the last turn's, at the end, is a token of its own.
        return answers[:-1] + [answers[-1] + " "]
    # (Qwen3.5's last turn follows the last user turn, so its template writes an empty think
    # block there, which --empty-think mask, the default, leaves out of the targets.)
    return [a + "<|im_end|>" for a in answers]


def expected_grids(family, processor, model_dir, reference, paths):
    if family in QWEN:
        return reference["image_grid_thw"].tolist()
    config = json.load(open(os.path.join(model_dir, "config.json")))
    vision = config["vision_config"]
    if family == "llava":
        size = vision["image_size"]
        # The processor's crop is the vision tower's image size, so [1, S/p, S/p] is its grid.
        assert [list(p.shape) for p in reference["pixel_values"]] == [[3, size, size]] * len(paths)
        return [[1, size // vision["patch_size"], size // vision["patch_size"]]] * len(paths)
    from transformers.image_utils import load_image

    side = vision["image_size"][0] // vision["patch_size"][0]
    tiles = processor.image_processor([load_image(p) for p in paths], crop_to_patches=True)["num_patches"]
    assert any(t > 1 for t in tiles), "the test images should give InternVL several tiles"
    return [[int(t), side, side] for t in tiles]


# --- every family: token ids, loss mask, grids -------------------------------------------------

@pytest.mark.parametrize("family", tiny_models.FAMILIES)
def test_tokens_grids_and_targets_match_the_processor(capsys, models, folder, family):
    model_dir, processor = models[family]
    records = cases(folder)
    rc, rows, err, _ = run(capsys, model_dir, folder, [r for r, _, _ in records])
    assert rc == 0, err
    assert len(rows) == len(records)
    tokenizer = processor.tokenizer
    for row, (_, messages, names) in zip(rows, records):
        reference = processor.apply_chat_template(copy.deepcopy(messages), tokenize=True, return_dict=True)
        assert row["input_ids"] == list(reference["input_ids"][0])
        assert len(row["loss_mask"]) == len(row["input_ids"])
        targets = [tokenizer.decode(r, skip_special_tokens=False) for r in runs(row["input_ids"], row["loss_mask"])]
        assert targets == expected_targets(family, messages)
        if names:
            paths = [str(folder / n) for n in names]
            assert row["images"] == [{"path": n} for n in names]  # relative to the output's folder
            assert row["image_grid_thw"] == expected_grids(family, processor, model_dir, reference, paths)
        else:
            assert "images" not in row and "image_grid_thw" not in row
    assert "wrote 4 samples" in err and "skipped 0 bad records" in err


def test_either_image_backend_gives_the_same_tokens_and_grids(capsys, models, folder):
    """mmsp prepare loads the processor as a user does (AutoProcessor: with torchvision installed,
    the torchvision image backend, whose pixels are up to 2/255 off the PIL backend's) and keeps
    only its tokens and grids: those must not depend on the backend. The reference is the PIL
    backend (tiny_models builds it by name), on sizes that scale up, down, tile and crop."""
    from PIL import Image
    from transformers import AutoProcessor

    sizes = [(1, 1), (3, 500), (17, 250), (57, 200), (113, 61), (300, 301), (640, 33), (56, 56)]
    for k, (w, h) in enumerate(sizes):
        Image.new("RGB", (w, h), (30 * k, 100, 200 - 20 * k)).save(folder / f"s{k}.png")
    messages = [user(*[image(folder, f"s{k}.png") for k in range(len(sizes))], text("What is this?")),
                assistant("A cat.")]
    record = {"messages": [{"role": "user", "content": [{"type": "image", "image": f"s{k}.png"}
                                                        for k in range(len(sizes))] + [text("What is this?")]},
                           {"role": "assistant", "content": "A cat."}]}
    for family in tiny_models.FAMILIES:
        model_dir, pil = models[family]
        assert type(pil.image_processor).__name__.endswith("Pil")
        default = AutoProcessor.from_pretrained(model_dir, local_files_only=True)
        assert not type(default.image_processor).__name__.endswith("Pil"), type(default.image_processor).__name__
        rc, rows, err, _ = run(capsys, model_dir, folder, [record])
        assert rc == 0, err
        want = pil.apply_chat_template(copy.deepcopy(messages), tokenize=True, return_dict=True)
        other = default.apply_chat_template(copy.deepcopy(messages), tokenize=True, return_dict=True)
        assert list(other["input_ids"][0]) == list(want["input_ids"][0]) == rows[0]["input_ids"], family
        if family in QWEN:
            assert other["image_grid_thw"].tolist() == want["image_grid_thw"].tolist() == rows[0]["image_grid_thw"]
        if family == "internvl":
            assert len(rows[0]["image_grid_thw"]) == len(sizes)


# A ChatML template with {% generation %} markers around each assistant turn's output: on a
# text-only conversation it renders what the released template renders, so transformers' own
# assistant mask (return_assistant_tokens_mask, which needs markers) is a second reference for
# the spans mmsp prepare finds without them. (Not for LLaVA: transformers' mask misses a span
# whose first token starts before it, as Llama's "▁A" does; nor Qwen3.5's thinking template.)
# transformers renders with trim_blocks: a newline right after a block tag goes, hence {{ '\n' }}.
MARKED = ("{% for message in messages %}{% if loop.first and message['role'] != 'system' and default_system %}"
          "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
          "<|im_start|>{{ message['role'] }}\n{% if message['role'] == 'assistant' %}{% generation %}"
          "{{ message['content'][0]['text'] }}<|im_end|>{% endgeneration %}{{ '\\n' }}{% else %}"
          "{{ message['content'][0]['text'] }}<|im_end|>\n{% endif %}{% endfor %}")


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "internvl"])
def test_targets_match_transformers_assistant_mask(capsys, models, folder, family):
    model_dir, processor = models[family]
    conversation = [{"role": "system", "content": [text("You are a helpful assistant.")]},
                    user(text("What is this?")), assistant("A cat."),
                    user(text("Hello there, how are you today?")), assistant("Fine, thanks."),
                    user(text("Describe the picture.")), assistant("A red square on a grey background.")]
    record = {"messages": [{"role": m["role"], "content": m["content"][0]["text"]} for m in conversation]}
    rc, rows, err, _ = run(capsys, model_dir, folder, [record])
    assert rc == 0, err
    default_system = family in ("qwen2_vl", "qwen2_5_vl")
    for messages in (conversation, conversation[1:]):  # with and without the system turn
        marked = processor.apply_chat_template(copy.deepcopy(messages), chat_template=MARKED, tokenize=False,
                                               default_system=default_system)
        assert marked == processor.apply_chat_template(copy.deepcopy(messages), tokenize=False)
    reference = processor.apply_chat_template(copy.deepcopy(conversation), chat_template=MARKED, tokenize=True,
                                              return_dict=True, return_assistant_tokens_mask=True,
                                              default_system=default_system)
    assert rows[0]["input_ids"] == list(reference["input_ids"][0])
    assert rows[0]["loss_mask"] == list(reference["assistant_masks"][0])
    assert sum(rows[0]["loss_mask"]) > 0


@pytest.mark.parametrize("family", ["qwen2_vl", "llava"])
def test_plain_text_is_all_targets(capsys, models, folder, family):
    model_dir, processor = models[family]
    line = "Hello there, how are you today? Fine, thanks."
    rc, rows, err, _ = run(capsys, model_dir, folder, [{"text": line}], "--format", "text")
    assert rc == 0, err
    assert rows == [{"input_ids": processor.tokenizer(line)["input_ids"],
                     "loss_mask": [1] * len(processor.tokenizer(line)["input_ids"])}]
    if family == "llava":
        assert rows[0]["input_ids"][0] == processor.tokenizer.bos_token_id  # the tokenizer's own <s>


# --- bad records -------------------------------------------------------------------------------

def bad_records(folder):
    """(record or raw line, what the error must say); line k + 1 of the input is entry k."""
    from PIL import Image

    (folder / "broken.png").write_bytes(b"this is not a PNG file")
    Image.new("RGB", (64, 64)).save(folder / "photo.webp")
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90° on display
    Image.new("RGB", (60, 100)).save(folder / "rotated.jpg", exif=exif)
    # The two modes whose PIL pixels mmsp's reader does not reproduce (src/train/data/image_file.h).
    Image.new("I;16", (56, 56), 40000).save(folder / "grey16.png")
    Image.new("CMYK", (56, 56), (10, 20, 30, 40)).save(folder / "cmyk.jpg")

    def one(value, **media):
        return {"conversations": [{"from": "human", "value": value}, {"from": "gpt", "value": "A cat."}], **media}

    missing = folder / "nothere.png"
    return [
        (one("<image>\nWhat is this?", image="cat.png"), None),
        (one("<image>\nWhat is this?", image="nothere.png"), f'image 0 file "{missing}" does not exist'),
        (one("<image><image>\nWhat is this?", image="cat.png"), "2 <image> markers but 1 image in the record"),
        (one("What is this?", images=["cat.png", "dog.png"]), "0 <image> markers but 2 images in the record"),
        ({"conversations": [{"from": "human", "value": "Hi"}, {"from": "tool", "value": "x"}]},
         'turn 1: unknown role "tool"'),
        (one("<image>\nWhat is this?", image="broken.png"), f'image 0 file "{folder / "broken.png"}" cannot be decoded'),
        ('{"conversations": [{"from": "human", "value": "Hi"}\n', "invalid JSON"),
        ("\n", None),  # a blank line is no record
        (one("Hello there"), None),
        (one("<image>\nWhat is this?", image="photo.webp"), "is WEBP, which mmsp's image reader cannot"),
        (one("<image>\nWhat is this?", image="rotated.jpg"), "has EXIF orientation 6"),
        (one("<image>\nWhat is this?", image="grey16.png"),
         "is a 16-bit grey image: transformers' processors (PIL's I;16 → RGB) clip each value at 255"),
        (one("<image>\nWhat is this?", image="cmyk.jpg"), "is a JPEG of 4 components in CMYK or YCCK"),
        ({"messages": [{"role": "assistant", "content": "A cat."}]},
         "the first turn after the system turns is an assistant turn"),
        ({"messages": [{"role": "user", "content": "Hi <|vision_start|>"}, {"role": "assistant", "content": "A cat."}]},
         "vision token <|vision_start|> outside any image or video block"),
        ([1, 2, 3], "a record must be a JSON object, not a list"),
    ]


def test_bad_records_are_named_by_line_and_nothing_is_written(capsys, models, folder):
    model_dir, _ = models["qwen2_vl"]
    entries = bad_records(folder)
    rc, rows, err, path = run(capsys, model_dir, folder, [r for r, _ in entries])
    assert rc == 2
    assert not os.path.exists(folder / "out.jsonl")
    assert err.strip() == f"mmsp prepare: error: {path}:2: {entries[1][1]}"
    assert not [n for n in os.listdir(folder) if n.startswith(".out.jsonl")]  # no temporary file left


def test_skip_bad_lists_every_bad_record(capsys, models, folder):
    model_dir, _ = models["qwen2_vl"]
    entries = bad_records(folder)
    rc, rows, err, path = run(capsys, model_dir, folder, [r for r, _ in entries], "--skip-bad")
    assert rc == 0, err
    bad = {k + 1: want for k, (_, want) in enumerate(entries) if want}
    assert len(rows) == len(entries) - len(bad) - 1  # the blank line is no record
    listed = dict(re.findall(rf"^{re.escape(str(path))}:(\d+): (.*) \(skipped\)$", err, re.M))
    assert sorted(int(k) for k in listed) == sorted(bad)
    for line, want in bad.items():
        assert want in listed[str(line)], (line, listed[str(line)])
    assert f"wrote {len(rows)} samples" in err and f"skipped {len(bad)} bad records" in err


def test_a_json_list_names_the_line_each_record_starts_on(capsys, models, folder):
    model_dir, _ = models["llava"]
    good = {"conversations": [{"from": "human", "value": "<image>\nWhat is this?"}, {"from": "gpt", "value": "A cat."}],
            "image": "cat.png"}
    text_ = ("[\n  " + json.dumps(good, indent=2).replace("\n", "\n  ") + ",\n"
             '  {"conversations": [\n     {"from": "human", "value": "Hi"},\n     {"from": "robot", "value": "x"}]}\n]\n')
    line = text_.splitlines().index('  {"conversations": [') + 1
    rc, rows, err, path = run(capsys, model_dir, folder, [text_], "--skip-bad", name="in.json")
    assert rc == 0, err
    assert len(rows) == 1 and rows[0]["images"] == [{"path": "cat.png"}]
    assert (f'{path}:{line}: turn 1: unknown role "robot" (expected user/human, assistant/gpt or system) '
            "(skipped)") in err


def test_a_failure_leaves_an_existing_output_untouched(capsys, models, folder):
    model_dir, _ = models["qwen3_vl"]
    (folder / "out.jsonl").write_text("old\n")
    good = {"text": "Hello there"}
    rc, _, err, path = run(capsys, model_dir, folder, [good, good, {"txt": "x"}])
    assert rc == 2
    assert f"{path}:3: cannot tell the format" in err
    assert (folder / "out.jsonl").read_text() == "old\n"
    assert sorted(os.listdir(folder)) == sorted(["out.jsonl", "in.jsonl"] + list(IMAGES))


def test_model_directory_checks(capsys, models, folder, tmp_path_factory):
    model_dir, processor = models["qwen2_vl"]
    broken = tmp_path_factory.mktemp("broken") / "model"
    shutil.copytree(model_dir, broken)
    config = json.load(open(broken / "config.json"))
    config["image_token_id"] += 1
    (broken / "config.json").write_text(json.dumps(config))
    rc, rows, err, _ = run(capsys, str(broken), folder, [{"text": "Hi"}])
    assert rc == 2 and not os.path.exists(folder / "out.jsonl")
    image_id = processor.image_token_id
    assert (f"config.json's image token id is {image_id + 1} but the processor's image token <|image_pad|> is id "
            f"{image_id}") in err
    config["model_type"] = "mistral"
    (broken / "config.json").write_text(json.dumps(config))
    rc, _, err, _ = run(capsys, str(broken), folder, [{"text": "Hi"}])
    assert rc == 2 and 'model_type "mistral" is not one mmsp trains' in err


# --- --max-length ------------------------------------------------------------------------------

def long_record():
    # An answer before the image, so that a cut inside the image block still leaves targets.
    return {"conversations": [{"from": "human", "value": "Hello there, how are you today?"},
                              {"from": "gpt", "value": "Fine, thanks."},
                              {"from": "human", "value": "<image>\nWhat is this?"},
                              {"from": "gpt", "value": "A cat."}],
            "image": "big.png"}


@pytest.mark.parametrize("family", ["qwen2_vl", "llava", "internvl"])
def test_truncate_never_cuts_inside_an_image_block(capsys, models, folder, family):
    model_dir, processor = models[family]
    rc, rows, err, _ = run(capsys, model_dir, folder, [long_record()])
    assert rc == 0, err
    full = rows[0]
    image_id = processor.image_token_id
    pads = [i for i, t in enumerate(full["input_ids"]) if t == image_id]
    # The block: Qwen's <|vision_start|> before the pads and <|vision_end|> after, InternVL's
    # <img> and </img>, LLaVA's pads alone.
    framed = family != "llava"
    first, last = pads[0] - framed, pads[-1] + framed
    assert pads == list(range(pads[0], pads[-1] + 1))
    for n in [first, first + 1, (first + last) // 2, last, last + 1, len(full["input_ids"]) - 1]:
        rc, rows, err, _ = run(capsys, model_dir, folder, [long_record()], "--max-length", str(n),
                               "--overflow", "truncate")
        assert rc == 0, err
        row = rows[0]
        ids = row["input_ids"]
        assert ids == full["input_ids"][:len(ids)] and row["loss_mask"] == full["loss_mask"][:len(ids)]
        if n <= last:  # the cut falls in the block (or just before it): the block goes
            assert len(ids) == first and "images" not in row and image_id not in ids
        else:
            assert len(ids) == n and row["images"] == full["images"]
            assert row["image_grid_thw"] == full["image_grid_thw"]


def test_refuse_names_the_line_and_its_length(capsys, models, folder):
    model_dir, _ = models["qwen2_5_vl"]
    rc, rows, _, _ = run(capsys, model_dir, folder, [long_record()])
    length = len(rows[0]["input_ids"])
    os.unlink(folder / "out.jsonl")
    rc, rows, err, path = run(capsys, model_dir, folder, [{"text": "Hi"}, long_record()], "--max-length", "20")
    assert rc == 2 and not os.path.exists(folder / "out.jsonl")
    assert f"{path}:2: {length} tokens, more than --max-length 20 (--overflow truncate cuts it)" in err
    rc, rows, err, _ = run(capsys, model_dir, folder, [long_record()], "--max-length", "5", "--overflow", "truncate")
    assert rc == 2 and "leave no target token" in err


# --- paths -------------------------------------------------------------------------------------

def test_media_paths_relative_to_the_output_or_absolute(capsys, models, folder):
    model_dir, _ = models["qwen3_5"]
    (folder / "imgs").mkdir()
    shutil.copy(folder / "cat.png", folder / "imgs" / "cat.png")
    record = {"conversations": [{"from": "human", "value": "<image>\nWhat is this?"}, {"from": "gpt", "value": "A cat."}],
              "image": "cat.png"}
    rc, rows, err, _ = run(capsys, model_dir, folder, [record], "--image-root", str(folder / "imgs"))
    assert rc == 0, err
    assert rows[0]["images"] == [{"path": os.path.join("imgs", "cat.png")}]
    (folder / "elsewhere").mkdir()
    rc, rows, err, _ = run(capsys, model_dir, folder, [record], output="elsewhere/out.jsonl")
    assert rc == 0, err
    assert rows[0]["images"] == [{"path": str(folder / "cat.png")}]


# --- videos ------------------------------------------------------------------------------------

def video_record(folder):
    from PIL import Image

    frames = []
    for k in range(3):
        Image.new("RGB", (64, 64), (80 * k, 0, 0)).save(folder / f"frame_{k}.png")
        frames.append(f"frame_{k}.png")
    return {"messages": [{"role": "user", "content": [{"type": "video", "video": frames},
                                                      {"type": "text", "text": "What moves?"}]},
                         {"role": "assistant", "content": "A dog."}]}


def write_clip(path, frames=20, width=64, height=48, fps=8):
    """A short h264 mp4 written by torchcodec's encoder (no binary fixture): a moving pattern, so
    every frame differs."""
    import torch
    from torchcodec.encoders import VideoEncoder

    t = torch.arange(frames).view(-1, 1, 1, 1)
    y, x = torch.arange(height).view(1, 1, -1, 1), torch.arange(width).view(1, 1, 1, -1)
    video = torch.cat([(x * 4 + t * 8 + 0 * y) % 256, (y * 5 + t * 3 + 0 * x) % 256, ((x + y + t * 10) * 2) % 256], 1)
    VideoEncoder(video.to(torch.uint8), frame_rate=fps).to_file(str(path))
    return path


def framed(model_dir, processor, ids):
    """transformers 5.17's token ids for a Qwen3-VL / Qwen3.5 video less the template's
    <|vision_start|> / <|vision_end|> around its timestamped blocks, which mmsp prepare drops
    with --video-wrapper drop (conversation._unwrap_framed_videos); checked to be exactly
    where that says, so this fails if transformers changes. Other families: the ids as they are."""
    ids = list(ids)
    if type(processor).__name__ != "Qwen3VLProcessor":
        return ids
    start, end, pad = (processor.tokenizer.convert_tokens_to_ids(t)
                       for t in ("<|vision_start|>", "<|vision_end|>", "<|video_pad|>"))
    seconds = processor.tokenizer.encode("<")[0]
    out, i = [], 0
    while i < len(ids):
        if ids[i] == start and ids[i + 1] == seconds:  # the template's start, then "<0.3 seconds>"
            depth, j = 0, i
            while True:  # its end: where the nesting closes
                depth += {start: 1, end: -1}.get(ids[j], 0)
                if depth == 0:
                    break
                j += 1
            inner = ids[i + 1:j]
            assert inner.count(start) == inner.count(end) >= 1 and pad in inner
            out += inner
            i = j + 1
            continue
        out.append(ids[i])
        i += 1
    return out


def reference_video(processor, messages, **processor_kwargs):
    """transformers given the video file's path itself, as a user would: token ids, grids and the
    frames its own sampling chose (video_metadata's frames_indices)."""
    return processor.apply_chat_template(copy.deepcopy(messages), tokenize=True, return_dict=True,
                                         processor_kwargs={"return_metadata": True, **processor_kwargs})


def clip_records(folder):
    """The same conversation as a messages part and LLaVA-style with a <video> marker."""
    return [{"messages": [{"role": "user", "content": [{"type": "video", "video": "clip.mp4"},
                                                       {"type": "text", "text": "What moves?"}]},
                          {"role": "assistant", "content": "A dog."}]},
            {"conversations": [{"from": "human", "value": "<video>\nWhat moves?"}, {"from": "gpt", "value": "A dog."}],
             "video": "clip.mp4"}]


@pytest.mark.parametrize("family", QWEN)
def test_frame_folders_match_the_processor(capsys, models, folder, family):
    from transformers.image_utils import load_image

    model_dir, processor = models[family]
    record = video_record(folder)
    rc, rows, err, _ = run(capsys, model_dir, folder, [record])
    assert rc == 0, err
    frames = [load_image(str(folder / f)) for f in record["messages"][0]["content"][0]["video"]]
    messages = [user({"type": "video", "video": frames}, text("What moves?")), assistant("A dog.")]
    reference = processor.apply_chat_template(
        messages, tokenize=True, return_dict=True,
        processor_kwargs={"do_sample_frames": False, "fps": 2.0, "video_metadata": [
            {"total_num_frames": 3, "fps": 2.0, "frames_indices": [0, 1, 2], "duration": 1.5}]})
    assert rows[0]["input_ids"] == list(reference["input_ids"][0])
    assert rows[0]["video_grid_thw"] == reference["video_grid_thw"].tolist()
    assert rows[0]["videos"] == [{"frames": record["messages"][0]["content"][0]["video"]}]
    if family == "qwen2_5_vl":
        assert rows[0]["second_per_grid_ts"] == reference["second_per_grid_ts"] == [1.0]


@pytest.mark.parametrize("family", QWEN)
def test_video_files_match_the_processor(capsys, models, folder, family):
    """Token ids, targets, grids, second_per_grid_ts, Qwen3-VL's timestamps and the sampled frames
    of an mp4: what transformers gives for the same file, from the model directory's video
    processor config (Qwen2-VL's tiny config decodes every frame; Qwen3-VL's samples 2 fps)."""
    model_dir, processor = models[family]
    write_clip(folder / "clip.mp4")
    rc, rows, err, _ = run(capsys, model_dir, folder, clip_records(folder))
    assert rc == 0, err
    messages = [user({"type": "video", "video": str(folder / "clip.mp4")}, text("What moves?")), assistant("A dog.")]
    reference = reference_video(processor, messages)
    indices = [int(i) for i in reference["video_metadata"][0].frames_indices]
    assert len(indices) == (20 if family in ("qwen2_vl", "qwen2_5_vl") else 5)
    grid = reference["video_grid_thw"].tolist()
    assert grid[0][0] == -(-len(indices) // 2)  # ceil(count / temporal_patch_size)
    for row in rows:  # the messages part and the LLaVA-style record alike
        assert row["input_ids"] == list(reference["input_ids"][0])
        assert row["videos"] == [{"path": "clip.mp4", "frame_indices": indices}]
        assert row["video_grid_thw"] == grid
        targets = [processor.tokenizer.decode(r) for r in runs(row["input_ids"], row["loss_mask"])]
        assert targets == expected_targets(family, messages)
        if family == "qwen2_5_vl":
            assert row["second_per_grid_ts"] == reference["second_per_grid_ts"] == [0.25]  # 2 frames / 8 fps
        else:
            assert "second_per_grid_ts" not in row
    if family in ("qwen3_vl", "qwen3_5"):  # frames 0, 5 | 10, 14 | 19 (19 again) at 8 fps
        shown = processor.tokenizer.decode(rows[0]["input_ids"])
        assert re.findall(r"<[\d.]+ seconds>", shown) == ["<0.3 seconds>", "<1.5 seconds>", "<2.4 seconds>"]
        assert processor.tokenizer.decode(reference["input_ids"][0]).count("<|vision_start|><0.3 seconds>") == 1


@pytest.mark.parametrize("family", ["qwen3_vl", "qwen3_5"])
def test_video_wrapper_drop_writes_the_released_processors_ids(capsys, models, folder, family):
    """--video-wrapper drop: transformers 5.x's ids (the default's) less the template's pair
    around a Qwen3-VL video's frame blocks, as the released processor wrote them (mmsp train
    reads both forms: hf.video_reference); the same grids and targets. (Qwen2-VL and Qwen2.5-VL
    write no wrapper: the flag is refused there, test_prepare_bounds.py.)"""
    model_dir, processor = models[family]
    write_clip(folder / "clip.mp4")
    rc, kept, err, _ = run(capsys, model_dir, folder, clip_records(folder)[:1])
    assert rc == 0, err
    rc, rows, err, _ = run(capsys, model_dir, folder, clip_records(folder)[:1], "--video-wrapper", "drop",
                           output="drop.jsonl")
    assert rc == 0, err
    messages = [user({"type": "video", "video": str(folder / "clip.mp4")}, text("What moves?")), assistant("A dog.")]
    reference = reference_video(processor, messages)
    assert kept[0]["input_ids"] == list(reference["input_ids"][0])
    assert rows[0]["input_ids"] == framed(model_dir, processor, reference["input_ids"][0])
    assert rows[0]["video_grid_thw"] == kept[0]["video_grid_thw"] == reference["video_grid_thw"].tolist()
    assert runs(rows[0]["input_ids"], rows[0]["loss_mask"]) == runs(kept[0]["input_ids"], kept[0]["loss_mask"])
    assert len(kept[0]["input_ids"]) == len(rows[0]["input_ids"]) + 2
    shown = processor.tokenizer.decode(kept[0]["input_ids"])
    assert shown.count("<|vision_start|><0.3 seconds><|vision_start|>") == 1, shown
    assert "<|vision_start|><0.3 seconds>" not in processor.tokenizer.decode(rows[0]["input_ids"])


@pytest.mark.parametrize("family,flags,config", [
    ("qwen2_5_vl", ["--video-fps", "4"], {"do_sample_frames": True, "fps": 4}),
    ("qwen2_vl", ["--video-num-frames", "6"], {"do_sample_frames": True, "num_frames": 6}),
    ("qwen3_vl", ["--video-num-frames", "8"], {"num_frames": 8, "fps": None}),
    ("qwen3_vl", ["--video-min-frames", "7"], {"min_frames": 7}),
    ("qwen3_5", ["--video-fps", "1", "--video-max-frames", "3"], {"fps": 1, "max_frames": 3}),
    ("qwen3_vl", ["--video-sample-frames", "off"], {"do_sample_frames": False}),
])
def test_video_sampling_flags_are_the_configs(capsys, models, folder, family, flags, config):
    """Each --video-* flag samples as the video processor config with that value would: the
    reference is transformers with the same attributes set on its video processor."""
    model_dir, processor = models[family]
    write_clip(folder / "clip.mp4")
    rc, rows, err, _ = run(capsys, model_dir, folder, clip_records(folder)[:1], *flags)
    assert rc == 0, err
    processor = copy.deepcopy(processor)
    for name, value in config.items():
        setattr(processor.video_processor, name, value)
    messages = [user({"type": "video", "video": str(folder / "clip.mp4")}, text("What moves?")), assistant("A dog.")]
    reference = reference_video(processor, messages)
    indices = [int(i) for i in reference["video_metadata"][0].frames_indices]
    assert rows[0]["videos"] == [{"path": "clip.mp4", "frame_indices": indices}]
    assert rows[0]["input_ids"] == list(reference["input_ids"][0])
    assert rows[0]["video_grid_thw"] == reference["video_grid_thw"].tolist()
    if family == "qwen2_5_vl":
        assert rows[0]["second_per_grid_ts"] == reference["second_per_grid_ts"]
    print(family, flags, indices)


def test_frame_folders_and_video_files_in_one_sample(capsys, models, folder):
    """Both kinds go to the processor together (one decoded layout): each keeps its own entry,
    grid and second_per_grid_ts, as transformers gives them for each alone."""
    model_dir, processor = models["qwen2_5_vl"]
    write_clip(folder / "clip.mp4", frames=12, fps=6)
    frames = video_record(folder)["messages"][0]["content"][0]["video"]
    record = {"messages": [{"role": "user", "content": [{"type": "video", "video": frames},
                                                        {"type": "video", "video": "clip.mp4"},
                                                        {"type": "text", "text": "What moves?"}]},
                           {"role": "assistant", "content": "A dog."}]}
    rc, rows, err, _ = run(capsys, model_dir, folder, [record])
    assert rc == 0, err
    alone = reference_video(processor, [user({"type": "video", "video": str(folder / "clip.mp4")}), assistant("A.")])
    assert rows[0]["videos"] == [{"frames": frames}, {"path": "clip.mp4", "frame_indices": list(range(12))}]
    assert rows[0]["video_grid_thw"] == [[2, 4, 4]] + alone["video_grid_thw"].tolist()
    assert rows[0]["second_per_grid_ts"] == [1.0] + alone["second_per_grid_ts"]


def test_bad_video_files_are_named_by_line_and_nothing_is_written(capsys, models, folder):
    import torch
    from PIL import Image
    from torchcodec.encoders import AudioEncoder, VideoEncoder

    model_dir, _ = models["qwen3_vl"]
    whole = write_clip(folder / "clip.mp4").read_bytes()
    (folder / "truncated.mp4").write_bytes(whole[: len(whole) // 2])  # the mp4 index (moov) is at its end
    (folder / "text.mp4").write_text("hello, not a video\n")
    VideoEncoder(torch.zeros(0, 3, 48, 64, dtype=torch.uint8), frame_rate=8).to_file(str(folder / "empty.mp4"))
    AudioEncoder(torch.zeros(1, 8000), sample_rate=8000).to_file(str(folder / "sound.mp3"))
    (folder / "sizes").mkdir()
    Image.new("RGB", (64, 64)).save(folder / "sizes" / "0.png")
    Image.new("RGB", (64, 32)).save(folder / "sizes" / "1.png")

    def record(video):
        return {"conversations": [{"from": "human", "value": "<video>\nWhat moves?"}, {"from": "gpt", "value": "A."}],
                "video": video}

    cases = [
        ("truncated.mp4", [], r'video 0 file "{}" cannot be read as a video: Could not open input file: .*'
                              r"Invalid data found when processing input"),
        ("text.mp4", [], r'video 0 file "{}" cannot be read as a video: Could not open input file'),
        ("empty.mp4", [], r'video 0 file "{}" holds no video stream \(no frame to decode\)'),
        ("sound.mp3", [], r'video 0 file "{}" holds no video stream \(no frame to decode\)'),
        ("missing.mp4", [], r'video 0 "{}" is neither a video file nor a folder of frames \(it does not exist\)'),
        ("sizes", [], r"video 0: its frames differ in size: \['64 x 32', '64 x 64'\]"),
        ("clip.mp4", ["--max-image-pixels", "1000"],
         r'video 0 file "{}" has frames of 64 x 48 = 3072 pixels, more than --max-image-pixels 1000'),
        # (Qwen2-VL's sampling refuses more frames than the file has; Qwen3-VL's repeats frames.)
        ("clip.mp4", ["--video-num-frames", "40", "--model", models["qwen2_vl"][0]],
         r'video 0 file "{}" \(20 frames at 8 fps\): the video processor\'s sampling refused it: .*num_frames=40'),
    ]
    for name, flags, words in cases:
        out = folder / "out.jsonl"
        rc, _, err, path = run(capsys, model_dir, folder, [{"text": "Hello there"}, record(name)], *flags)
        assert rc == 2 and not out.exists(), (name, err)
        assert re.search(f"^mmsp prepare: error: {re.escape(str(path))}:2: " + words.format(re.escape(str(folder / name))),
                         err.strip()), (name, err)
    for family in ("llava", "internvl"):  # a family mmsp trains no video for
        rc, _, err, path = run(capsys, models[family][0], folder, [record("clip.mp4")])
        assert rc == 2 and f"{path}:1: video 0: mmsp trains videos for the Qwen families only, not {family}" in err


def test_video_flags_are_checked(capsys, models, folder):
    model_dir, _ = models["qwen2_vl"]
    write_clip(folder / "clip.mp4")
    for flags, words in [
        (["--video-fps", "0"], "--video-fps 0.0 must be a finite number above 0"),
        (["--video-num-frames", "0"], "--video-num-frames 0 must be at least 1"),
        (["--video-fps", "2", "--video-num-frames", "4"], "--video-fps 2 and --video-num-frames 4 are exclusive"),
        (["--video-min-frames", "5", "--video-max-frames", "4"], "--video-min-frames 5 is above --video-max-frames 4"),
        (["--video-num-frames", "4", "--video-sample-frames", "off"], "--video-sample-frames off decodes every frame"),
        (["--video-max-frames", "4"], "--video-max-frames bound the frames sampled, but the video processor of "
                                      f'--model "{model_dir}" does not sample (do_sample_frames false)'),
    ]:
        rc, _, err, _ = run(capsys, model_dir, folder, clip_records(folder)[:1], *flags)
        assert rc == 2 and words in err, (flags, err)


# --- the command -------------------------------------------------------------------------------

def test_the_command_exit_codes_and_messages(models, folder):
    model_dir, _ = models["internvl"]
    env = dict(os.environ, PYTHONPATH=os.path.join(tiny_models.REPO, "python"), PYTHONDONTWRITEBYTECODE="1")
    good = {"conversations": [{"from": "human", "value": "<image>\nWhat is this?"}, {"from": "gpt", "value": "A cat."}],
            "image": "cat.png"}
    (folder / "in.jsonl").write_text(json.dumps(good) + "\n" + json.dumps({"text": 3}) + "\n")

    def command(*flags):
        return subprocess.run([sys.executable, "-m", "mmsp.prepare", "--model", model_dir, "--input",
                               str(folder / "in.jsonl"), *flags], env=env, capture_output=True, text=True)

    done = command()
    assert done.returncode == 2 and not os.path.exists(folder / "in.prepared.jsonl")
    assert done.stderr.strip() == f'mmsp prepare: error: {folder / "in.jsonl"}:2: "text" must be a string, not a number'
    done = command("--skip-bad")
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in open(folder / "in.prepared.jsonl")]
    assert len(rows) == 1 and rows[0]["image_grid_thw"][0][1:] == [4, 4]
    assert done.stderr.splitlines()[-1] == (
        f"mmsp prepare: wrote 1 sample ({len(rows[0]['input_ids'])} tokens, {sum(rows[0]['loss_mask'])} targets) "
        f"to {folder / 'in.prepared.jsonl'}; skipped 1 bad record")
    done = command("--max-length", "0")
    assert done.returncode == 2 and done.stderr.strip() == "mmsp prepare: error: --max-length 0 must be at least 1"
    done = command("--overflow", "drop")
    assert done.returncode == 2 and "argument --overflow: invalid choice: 'drop'" in done.stderr


# --- reasoning traces (Qwen3.5's released template) --------------------------------------------

def test_the_released_qwen3_5_templates_are_unchanged():
    """tests/python/data/README.md: the chat_template.jinja of Qwen3.5-4B and larger and of
    Qwen3.5-2B and smaller, as huggingface/trl keeps them (trl/chat_templates/qwen3_5_think.jinja
    and qwen3_5_nothink.jinja at f2cd57710ae345ea6428ae95363267fcf38a3dc8), byte for byte."""
    import hashlib

    for name, sha256 in [("qwen3_5_chat_template.jinja",
                          "a4aee8afcf2e0711942cf848899be66016f8d14a889ff9ede07bca099c28f715"),
                         ("qwen3_5_2b_chat_template.jinja",
                          "273d8e0e683b885071fb17e08d71e5f2a5ddfb5309756181681de4f5a1822d80")]:
        with open(os.path.join(tiny_models.DATA, name), "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == sha256, name
    assert tiny_models.TEMPLATES["qwen3_5"] == tiny_models.QWEN3_5_TEMPLATE


def with_reasoning(question, answer, reasoning):
    """A record's turn pair and transformers' messages for it: reasoning given as
    "reasoning_content"."""
    return ([{"role": "user", "content": question},
             {"role": "assistant", "content": answer, "reasoning_content": reasoning}],
            [user(text(question)), dict(assistant(answer), reasoning_content=reasoning)])


def reasoning_cases():
    """(record, transformers' messages, what the targets decode to, reasoning the template drops)."""
    q, a, r = "What is this?", "A cat.", "It purrs."
    block = f"<think>\n{r}\n</think>\n\n{a}"
    last = f"{r}\n</think>\n\n{a}<|im_end|>"  # the generation prompt ends with "<think>\n"
    turns, messages = with_reasoning(q, a, r)
    later, later_messages = with_reasoning("And this?", "A dog.", "It barks.")
    return [
        # "reasoning_content", as OpenAI-style exports and ms-swift / LLaMA-Factory data carry it.
        ({"messages": turns}, messages, [last], None),
        # The same reasoning inline: the template renders both alike.
        ({"messages": [turns[0], {"role": "assistant", "content": block}]},
         [user(text(q)), assistant(block)], [last], None),
        # A model's raw output, whose "<think>" was the prompt's.
        ({"messages": [turns[0], {"role": "assistant", "content": f"{r}\n</think>\n\n{a}"}]},
         [user(text(q)), assistant(f"{r}\n</think>\n\n{a}")], [last], None),
        # LLaVA format: inline, and as "reasoning_content" beside "value".
        ({"conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": block}]},
         [user(text(q)), assistant(block)], [last], None),
        ({"conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a, "reasoning_content": r}]},
         messages, [last], None),
        # Two rounds: the template drops the first answer's reasoning (it precedes the last user
        # turn), so only the answer is learnt there.
        ({"messages": turns + later}, messages + later_messages,
         [f"{a}<|im_end|>", "It barks.\n</think>\n\nA dog.<|im_end|>"], r),
        # Two answers after the last user turn: both keep their reasoning.
        ({"messages": turns + later[1:]}, messages + later_messages[1:],
         [last, "It barks.\n</think>\n\nA dog.<|im_end|>"], None),
    ]


@pytest.mark.parametrize("flags", [(), ("--enable-thinking", "on"), ("--enable-thinking", "off")])
def test_reasoning_tokens_and_targets_match_the_released_template(capsys, models, folder, flags):
    """Token ids: apply_chat_template(..., tokenize=True) of the released Qwen3.5 template, with
    enable_thinking when the flag is given. Targets: the reasoning and answer of every turn the
    template keeps reasoning for, the answer alone of earlier turns, whatever --enable-thinking
    (it changes only the generation prompt, which ends in "<think>\n" both ways once a turn
    has reasoning)."""
    model_dir, processor = models["qwen3_5"]
    kwargs = {"enable_thinking": flags[1] == "on"} if flags else {}
    entries = reasoning_cases()
    rc, rows, err, _ = run(capsys, model_dir, folder, [r for r, _, _, _ in entries], *flags)
    assert rc == 0, err
    for k, (row, (_, messages, expected, dropped)) in enumerate(zip(rows, entries)):
        reference = processor.apply_chat_template(copy.deepcopy(messages), tokenize=True, return_dict=True, **kwargs)
        assert row["input_ids"] == list(reference["input_ids"][0]), k
        rendered = processor.apply_chat_template(copy.deepcopy(messages), tokenize=False, **kwargs)
        targets = [processor.tokenizer.decode(r) for r in runs(row["input_ids"], row["loss_mask"])]
        assert targets == expected, k
        assert all(t in rendered for t in targets)  # nothing learnt that is not in the sequence
        if dropped:
            assert dropped not in rendered and not any(dropped in t for t in targets)
    # Inline or beside, the same sample.
    assert rows[0] == rows[1] == rows[2] == rows[3] == rows[4]


@pytest.mark.parametrize("size", ["4b", "2b"])
def test_empty_think_blocks(capsys, models, folder, tmp_path, size):
    """A turn without reasoning gets the template's empty think block. --empty-think mask (the
    default) leaves it out of the targets; train teaches the model to close it at once, save
    what the generation prompt holds: with enable_thinking false (Qwen3.5-2B's default) the
    prompt holds the whole block, so it is never a target."""
    if size == "4b":
        model_dir, processor = models["qwen3_5"]
        thinking_by_default = True
    else:
        model_dir = str(tmp_path / "qwen3_5-2b")
        processor = tiny_models.build("qwen3_5", model_dir, tiny_models.QWEN3_5_SMALL_TEMPLATE)
        thinking_by_default = False
    record = {"messages": [{"role": "user", "content": "What is this?"}, {"role": "assistant", "content": "A cat."},
                           {"role": "user", "content": "And this?"}, {"role": "assistant", "content": "A dog."}]}
    messages = [user(text("What is this?")), assistant("A cat."), user(text("And this?")), assistant("A dog.")]
    rendered = processor.apply_chat_template(copy.deepcopy(messages), tokenize=False)
    assert rendered.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nA dog.<|im_end|>\n")
    reference = list(processor.apply_chat_template(copy.deepcopy(messages), tokenize=True)[0])
    for empty, thinking, last in [
            (None, None, "A dog.<|im_end|>"),
            ("mask", "on", "A dog.<|im_end|>"),
            ("mask", "off", "A dog.<|im_end|>"),
            ("train", None, "\n</think>\n\nA dog.<|im_end|>" if thinking_by_default else "A dog.<|im_end|>"),
            ("train", "on", "\n</think>\n\nA dog.<|im_end|>"),
            ("train", "off", "A dog.<|im_end|>")]:
        flags = (("--empty-think", empty) if empty else ()) + (("--enable-thinking", thinking) if thinking else ())
        rc, rows, err, _ = run(capsys, model_dir, folder, [record], *flags)
        assert rc == 0, err
        assert rows[0]["input_ids"] == reference, flags  # the full render ignores enable_thinking
        targets = [processor.tokenizer.decode(r) for r in runs(rows[0]["input_ids"], rows[0]["loss_mask"])]
        assert targets == ["A cat.<|im_end|>", last], flags


def bad_reasoning():
    """(record, what the error must say)."""
    def one(answer, **fields):
        return {"messages": [{"role": "user", "content": "What is this?"},
                             {"role": "assistant", "content": answer, **fields}]}

    return [
        ({"messages": [{"role": "user", "content": "Hi", "reasoning_content": "x"},
                       {"role": "assistant", "content": "A."}]},
         'turn 0 (user): "reasoning_content" belongs in assistant turns'),
        ({"conversations": [{"from": "system", "value": "Be brief.", "reasoning_content": "x"},
                            {"from": "human", "value": "Hi"}, {"from": "gpt", "value": "A."}]},
         'turn 0 (system): "reasoning_content" belongs in assistant turns'),
        (one("A cat.", reasoning_content=3), 'turn 1: "reasoning_content" must be a string, not a number'),
        (one("A cat.", reasoning_content=["x"]), 'turn 1: "reasoning_content" must be a string, not a list'),
        (one("<think>x</think>A cat.", reasoning_content="y"),
         'turn 1: both "reasoning_content" and <think> in the text: give the reasoning once'),
        (one("A cat.", reasoning_content="<think>x"), 'turn 1: "reasoning_content" contains "<think>"'),
        (one("Sure. <think>x</think>A cat."), 'turn 1: text before "<think>" ("Sure."): the template drops it'),
        (one("<think>x</think>A</think> cat."), 'turn 1: 1 "<think>" and 2 "</think>" in the text'),
        (one("<think>x A cat."), 'turn 1: 1 "<think>" and 0 "</think>" in the text'),
        (one("x</think>A <think>cat."), 'turn 1: "<think>" after "</think>" in the text'),
        (one("A cat.", reasoning_content="It purrs.<|im_end|>"),
         "turn 1 (assistant) contains the template's end-of-turn marker <|im_end|>"),
    ]


def test_bad_reasoning_is_named_by_line_turn_and_value(capsys, models, folder):
    model_dir, _ = models["qwen3_5"]
    entries = bad_reasoning()
    for record, message in entries:
        rc, _, err, path = run(capsys, model_dir, folder, [record])
        assert rc == 2 and not os.path.exists(folder / "out.jsonl"), message
        assert err.startswith(f"mmsp prepare: error: {path}:1: {message}"), err
    # Null is no reasoning (OpenAI-style exports write it so).
    good = {"messages": [{"role": "user", "content": "Hi"},
                         {"role": "assistant", "content": "A.", "reasoning_content": None}]}
    rc, rows, err, path = run(capsys, model_dir, folder, [good] + [r for r, _ in entries], "--skip-bad")
    assert rc == 0 and len(rows) == 1, err
    for line, (_, message) in enumerate(entries, start=2):
        assert f"{path}:{line}: {message}" in err


def test_enable_thinking_needs_a_template_that_reads_it(capsys, models, folder):
    model_dir, _ = models["qwen3_vl"]
    record = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "A."}]}
    rc, _, err, _ = run(capsys, model_dir, folder, [record], "--enable-thinking", "off")
    assert rc == 2 and err.strip() == (
        "mmsp prepare: error: --enable-thinking off: the model directory's chat template does not read "
        "enable_thinking, so the flag would change nothing; leave it out")
    # --empty-think changes nothing for a template that writes no think block.
    _, plain, _, _ = run(capsys, model_dir, folder, [record])
    _, trained, _, _ = run(capsys, model_dir, folder, [record], "--empty-think", "train")
    assert plain == trained


# --- preference pairs (DPO): TRL 1.16's own tokenization as the reference -----------------------

def preference_records():
    """TRL's preference records: a vision one in rlaif-v's layout (image parts without a path, the
    images at the top level), one whose prompt is a string with the images put before it (TRL's
    prepare_multimodal_messages), a text-only conversational one, a standard (string) one and
    two with the prompt implicit (TRL's extract_prompt)."""
    ask = [{"role": "user", "content": "What is this?"}]
    return [
        {"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]}],
         "chosen": [{"role": "assistant", "content": "A cat."}],
         "rejected": [{"role": "assistant", "content": [{"type": "text", "text": "A dog on the left."}]}],
         "images": ["cat.png"]},
        {"prompt": [{"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": "Compare the two images."}],
         "chosen": [{"role": "assistant", "content": "The first is larger than the second."}],
         "rejected": [{"role": "assistant", "content": "A red square."}],
         "images": ["dog.png", "big.png"]},
        {"prompt": [{"role": "user", "content": "Hello there, how are you today?"}],
         "chosen": [{"role": "assistant", "content": "Fine, thanks."}],
         "rejected": [{"role": "assistant", "content": "A dog."}]},
        {"prompt": "Describe the picture.", "chosen": " A red square on a grey background.", "rejected": " A cat."},
        {"chosen": "What is this? A cat.", "rejected": "What is this? A dog on the left."},
        {"chosen": ask + [{"role": "assistant", "content": "A cat."}],
         "rejected": ask + [{"role": "assistant", "content": "A dog."}]},
    ]


def trl_pair(processor, record, folder):
    """TRL's DPO tokenization of `record`: DataCollatorForVisionPreference for a record with images
    (TRL's vision path), else DPOTrainer._prepare_dataset then DataCollatorForPreference; returns
    [(input_ids, completion_mask)] for chosen and rejected, padding left out."""
    from datasets import Dataset
    from transformers.image_utils import load_image
    from trl import DPOConfig
    from trl.trainer.dpo_trainer import DataCollatorForPreference, DataCollatorForVisionPreference, DPOTrainer

    record = copy.deepcopy(record)
    if "images" in record:
        record["images"] = [load_image(str(folder / name)) for name in record["images"]]
        batch = DataCollatorForVisionPreference(processor)([record])
    else:
        args = DPOConfig(output_dir=str(folder / "trl"), report_to=[], use_cpu=True, bf16=False)
        # The trainer's own method, on the one attribute it reads (the tokenizer, for the EOS token).
        trainer = type("Trainer", (), {"_tokenizer": processor.tokenizer})()
        row = DPOTrainer._prepare_dataset(trainer, Dataset.from_list([record]), processor, args, "train")[0]
        batch = DataCollatorForPreference(pad_token_id=processor.tokenizer.pad_token_id)([row])
    out = []
    for ids, attention, mask in zip(batch["input_ids"], batch["attention_mask"], batch["completion_mask"]):
        keep = attention.bool()
        out.append((ids[keep].tolist(), mask[keep].tolist()))
    return out, batch


@pytest.mark.parametrize("family", ["qwen2_vl", "llava"])
def test_preference_pairs_match_trl_dpo_tokenization(capsys, models, folder, family):
    import datasets

    datasets.disable_progress_bars()
    model_dir, processor = models[family]
    records = preference_records()
    rc, rows, err, _ = run(capsys, model_dir, folder, records)
    assert rc == 0, err
    assert len(rows) == len(records)
    for row, record in zip(rows, records):
        assert set(row) == {"chosen", "rejected"}
        want, batch = trl_pair(processor, record, folder)
        for key, (ids, mask) in zip(("chosen", "rejected"), want):
            side = row[key]
            assert side["input_ids"] == ids, (family, key, record)
            assert side["loss_mask"] == mask, (family, key, record)
            if "images" in record:
                assert side["images"] == [{"path": n} for n in record["images"]]
                grids = batch["image_grid_thw"].tolist()[:len(record["images"])] if family == "qwen2_vl" \
                    else [[1, 4, 4]] * len(record["images"])  # the tiny LLaVA's vision tower: 4 x 4 patches
                assert side["image_grid_thw"] == grids
            else:
                assert "images" not in side
    assert f"wrote {len(records)} preference pairs" in err


def bad_preferences(folder):
    """(record, what the error must say); line k + 1 of the input is entry k."""
    ask = [{"role": "user", "content": "What is this?"}]
    cat, dog = [{"role": "assistant", "content": "A cat."}], [{"role": "assistant", "content": "A dog."}]
    return [
        ({"prompt": ask, "chosen": cat, "rejected": dog}, None),
        ({"prompt": ask, "chosen": cat}, 'a preference record needs "chosen" and "rejected": "rejected" is missing '
                                         '(it has "prompt", "chosen")'),
        ({"prompt": ask, "chosen": [{"role": "assistant", "content": ""}], "rejected": dog},
         '"chosen" is empty: its turns hold no text'),
        ({"prompt": ask, "chosen": cat, "rejected": []}, '"rejected" is empty: it needs at least one message'),
        ({"prompt": ask, "chosen": cat, "rejected": cat}, '"chosen" and "rejected" are the same: nothing to prefer'),
        ({"prompt": "What is this?", "chosen": cat, "rejected": dog},
         '"prompt" is a string, "chosen" is a list, "rejected" is a list: give them all as lists of messages'),
        ({"prompt": ask, "chosen": cat, "rejected": [{"role": "tool", "content": "x"}]},
         '"rejected" turn 0: unknown role "tool"'),
        ({"prompt": ask, "chosen": ask + cat, "rejected": dog},
         '"chosen" turn 0 is a user turn: a completion holds assistant turns only'),
        ({"prompt": ask + cat, "chosen": cat, "rejected": dog}, '"prompt" ends with an assistant turn: its last turn must be a user turn'),
        ({"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]}],
          "chosen": cat, "rejected": dog, "images": ["cat.png", "dog.png"]},
         '"prompt" has 1 image part without a path but the record has 2 images'),
        ({"prompt": ask, "chosen": cat, "rejected": dog, "images": ["nothere.png"]},
         f'image 0 file "{folder / "nothere.png"}" does not exist'),
        ({"prompt": "What is this?", "chosen": "A cat.", "rejected": "A dog.", "images": ["cat.png"]},
         'a standard (string) preference record cannot have "images"'),
        ({"prompt": ask, "chosen": [{"role": "assistant", "content": "A cat.<|im_end|>"}], "rejected": dog},
         '"chosen" turn 0 (assistant) contains the template\'s end-of-turn marker <|im_end|>'),
        ({"prompt": ask, "chosen": cat, "rejected": dog, "videos": ["clip.mp4"]},
         'a preference record cannot have "videos": TRL\'s DPO takes images only'),
        ({"chosen": "A cat.", "rejected": "The dog."}, '"prompt" is empty (no "prompt", and chosen and rejected'),
        ({"messages": ask + cat}, "a conversation or text record in a file whose records before it are preference "
                                  "pairs: one output holds pairs (for --objective dpo) or samples, not both"),
    ]


def test_bad_preference_records_are_named_by_line_and_field(capsys, models, folder):
    model_dir, _ = models["qwen2_vl"]
    entries = bad_preferences(folder)
    rc, rows, err, path = run(capsys, model_dir, folder, [r for r, _ in entries])
    assert rc == 2 and not os.path.exists(folder / "out.jsonl")
    assert err.strip() == f"mmsp prepare: error: {path}:2: {entries[1][1]}"
    rc, rows, err, path = run(capsys, model_dir, folder, [r for r, _ in entries], "--skip-bad")
    assert rc == 0, err
    bad = {k + 1: want for k, (_, want) in enumerate(entries) if want}
    assert len(rows) == len(entries) - len(bad)
    listed = dict(re.findall(rf"^{re.escape(str(path))}:(\d+): (.*) \(skipped\)$", err, re.M))
    assert sorted(int(k) for k in listed) == sorted(bad)
    for line, want in bad.items():
        assert want in listed[str(line)], (line, listed[str(line)])
    assert f"wrote {len(rows)} preference pair" in err
    # --format preference names what such a record lacks.
    rc, _, err, path = run(capsys, model_dir, folder, [{"messages": ask_cat()}], "--format", "preference")
    assert rc == 2 and 'a preference record needs "chosen" and "rejected": "chosen" is missing' in err, err


def ask_cat():
    return [{"role": "user", "content": "What is this?"}, {"role": "assistant", "content": "A cat."}]
