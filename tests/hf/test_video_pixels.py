"""mmsp's pixels of videos against transformers' own video processors (Qwen2VLVideoProcessor,
Qwen3VLVideoProcessor: torchvision backend), value for value, for the four Qwen families.

Video files: an .mp4 written by torchcodec's encoder (h264), its frames chosen by a data line's
`frame_indices`; the reference decodes the same indices with torchcodec (what transformers'
fetch_videos calls) and hands the frames to the processor. mmsp decodes with FFmpeg and
converts to RGB as torchcodec does (train/data/video_file.h), then resizes and normalises as
the processor does (ATen's antialiased bicubic on uint8, the fused normalisation). Widths
that are a multiple of 32 (torchcodec's swscale path) and not (its filter graph), frames
resized and not; untagged streams (FFmpeg's BT.601 default) and streams tagged BT.709, in
limited and in full range (the colour matrix the conversion takes from each frame). Frame
folders: the same frames as PNG files, the processor given the images.
Bad video files are refused when the data is read, naming the line and the rule; damaged ones
(a packet overwritten, a header that lies) when decoded, as torchcodec refuses them, naming the
line, the file and the frame.
"""
import json
import re
import struct
import subprocess

import pytest
import torch
import torchcodec.encoders  # requirements/hf.txt pins it: never skipped
from PIL import Image
from safetensors.torch import load_file

import families as F
import processors as P
import video_bytes as V
from test_pixels import _mmsp_pixels

FAMILY_NAMES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5"]
# (width, height, colour tags): 128 a multiple of 32 (swscale), 140 and 58 not (filter graph);
# sizes the processor resizes (every one of them here: min_pixels) and odd sides. Tagged
# BT.709 on both paths, one of them full range: decoded untagged, they differ by up to 20
# levels, so a conversion that ignored the tags would fail here.
BT709 = {"colorspace": "bt709", "color_primaries": "bt709", "color_trc": "bt709"}
CLIPS = [(128, 96, {}), (140, 112, {}), (58, 202, {}), (128, 96, BT709),
         (140, 112, {**BT709, "color_range": "pc"})]
INDICES = [0, 2, 5, 6, 9]  # 5 frames: the last repeated to fill the temporal patch
FRAMES = 12


def _video_processor(name, pre):
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    cls = Qwen2VLVideoProcessor if name in ("qwen2_vl", "qwen2_5_vl") else Qwen3VLVideoProcessor
    keys = ("patch_size", "temporal_patch_size", "merge_size", "image_mean", "image_std", "size")
    return cls(**{k: pre[k] for k in keys if k in pre}, cap_pixels_per_frame=False)


def _clip(width, height, seed, frames=FRAMES):
    """`frames` smooth frames, [N, 3, H, W] uint8."""
    return torch.stack([torch.from_numpy(P.smooth_image(width, height, seed=seed * 100 + i)).permute(2, 0, 1)
                        for i in range(frames)])


def _write_video(path, width, height, seed, tags=None, frames=FRAMES, codec=None):
    """An h264 clip (the container's default codec where `codec` is given: its name) of `frames` smooth
    frames, in the container the file's extension names; `tags`: encoder options (colour tags written
    in the stream, the group of pictures)."""
    torchcodec.encoders.VideoEncoder(_clip(width, height, seed, frames), frame_rate=8).to_file(
        str(path), codec=codec, extra_options=tags or None)


def _line(name, family, cfg, grid, video):
    """A data line with one video of `grid` (Qwen3-VL / Qwen3.5: a block per temporal patch)."""
    m = cfg["vision_config"]["spatial_merge_size"]
    t, h, w = grid
    pad = family.overrides["video_token_id"]
    if name in ("qwen3_vl", "qwen3_5"):
        ids = [tok for _ in range(t) for tok in (5, 6, family.start_token, *[pad] * (h * w // (m * m)),
                                                  family.end_token)]
    else:
        ids = [family.start_token, *[pad] * (t * h * w // (m * m)), family.end_token]
    return {"input_ids": [1, *ids, 2], "videos": [video], "video_grid_thw": [grid]}


def _model(name, tmp_path):
    family = F.FAMILIES[name]
    cfg = F.config_dict(family)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(cfg))
    pre = P.preprocessor_config(name, cfg)
    return family, cfg, model_dir, _video_processor(name, pre)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_video_pixels_equal_the_video_processor(name, tmp_path, mmsp_bin):
    from torchcodec.decoders import VideoDecoder

    family, cfg, model_dir, processor = _model(name, tmp_path)
    lines, expected = [], []
    for k, (w, h, tags) in enumerate(CLIPS):
        path = tmp_path / f"clip{k}.mp4"
        _write_video(path, w, h, seed=k, tags=tags)
        decoder = VideoDecoder(str(path))
        assert decoder.metadata.color_space == tags.get("colorspace"), decoder.metadata
        frames = decoder.get_frames_at(INDICES).data  # [N, 3, H, W] uint8
        out = processor(videos=[frames], do_sample_frames=False, return_tensors="pt")
        grid = out["video_grid_thw"][0].tolist()
        lines.append(_line(name, family, cfg, grid, {"path": path.name, "frame_indices": INDICES}))
        expected.append(out["pixel_values_videos"])
        # The same frames as a folder of PNG files (lossless): the processor given the images.
        names = []
        for i, frame in enumerate(frames):
            names.append(f"clip{k}_{i}.png")
            Image.fromarray(frame.permute(1, 2, 0).numpy()).save(tmp_path / names[-1])
        images = [Image.open(tmp_path / n) for n in names]
        out = processor(videos=[images], do_sample_frames=False, return_tensors="pt")
        assert out["video_grid_thw"][0].tolist() == grid
        lines.append(_line(name, family, cfg, grid, {"frames": names}))
        expected.append(out["pixel_values_videos"])
    rc, err, got = _mmsp_pixels(mmsp_bin, model_dir, tmp_path, lines)
    assert rc == 0, err
    for i, ref in enumerate(expected):
        mine = got[f"sample{i}.video0"]
        what = f"{name} {'file' if i % 2 == 0 else 'frame folder'} {CLIPS[i // 2]}"
        assert mine.shape == ref.shape, f"{what}: mmsp {tuple(mine.shape)} vs processor {tuple(ref.shape)}"
        diff = (mine - ref).abs().max().item()
        assert torch.equal(mine, ref), f"{what}: off by up to {diff:.3e} (normalised units)"


# Clips of several groups of pictures (x264 options, through torchcodec's encoder): key frames
# every 4 frames; every 6 with open groups (leading B-frames that refer to the group before);
# every 6 with 2 B-frames. Frames asked out of order, twice, across groups and within one.
GOP_CLIPS = {"gop4": {"g": "4"}, "open_gop6": {"x264-params": "keyint=6:min-keyint=6:open-gop=1:bframes=3"},
             "gop6_b2": {"g": "6", "bf": "2"}}
GOP_INDICES = [17, 3, 9, 10, 24, 30, 31, 39, 39]


def test_video_files_seek_as_torchcodec(tmp_path, mmsp_bin):
    """mmsp seeks to the key frame before each frame asked (decoding on where that is shorter),
    as torchcodec's get_frames_at does: the same pixels as the processor given torchcodec's
    frames, for a fraction of the decoding. Without seeking, every clip would decode all 40
    frames up to the last asked."""
    from torchcodec.decoders import VideoDecoder

    name = "qwen2_vl"
    family, cfg, model_dir, processor = _model(name, tmp_path)
    for clip, options in GOP_CLIPS.items():
        _write_video(tmp_path / f"{clip}.mp4", 128, 96, seed=5, tags=options, frames=40)
        decoded = VideoDecoder(str(tmp_path / f"{clip}.mp4")).get_frames_at(GOP_INDICES).data
        out = processor(videos=[decoded], do_sample_frames=False, return_tensors="pt")
        line = _line(name, family, cfg, out["video_grid_thw"][0].tolist(),
                     {"path": f"{clip}.mp4", "frame_indices": GOP_INDICES})
        (tmp_path / "data.jsonl").write_text(json.dumps(line) + "\n")
        r = subprocess.run([mmsp_bin, "pixels", "--model", str(model_dir / "config.json"), "--data",
                            str(tmp_path / "data.jsonl"), "--out", str(tmp_path / "pixels.safetensors")],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        mine = load_file(str(tmp_path / "pixels.safetensors"))["sample0.video0"]
        assert torch.equal(mine, out["pixel_values_videos"]), \
            f"{clip}: off by up to {(mine - out['pixel_values_videos']).abs().max().item():.3e}"
        counts = re.search(r"video files: (\d+) frames decoded, (\d+) seeks", r.stdout)
        assert counts, r.stdout
        decoded_frames, seeks = int(counts[1]), int(counts[2])
        print(f"{clip}: {decoded_frames} frames decoded, {seeks} seeks")
        assert seeks >= 4 and decoded_frames <= 26, f"{clip}: {decoded_frames} frames decoded in {seeks} seeks"


def test_bad_video_files_are_refused_by_line(tmp_path, mmsp_bin):
    family, cfg, model_dir, processor = _model("qwen2_vl", tmp_path)
    _write_video(tmp_path / "clip.mp4", 128, 96, seed=0)
    whole = (tmp_path / "clip.mp4").read_bytes()
    (tmp_path / "cut.mp4").write_bytes(whole[: len(whole) // 3])
    (tmp_path / "text.mp4").write_text("not a video\n")
    grid = [3, 8, 10]
    cases = [
        ({"path": "clip.mp4", "frame_indices": [0, 12]}, "frame index 12 is past the end of"),
        ({"path": "text.mp4", "frame_indices": [0]}, "is not a video FFmpeg can open"),
        ({"path": "none.mp4", "frame_indices": [0]}, "does not exist"),
        ({"path": "clip.mp4"}, "without \"frame_indices\""),
        ({"path": "clip.mp4", "frame_indices": [0, -1]}, "frame indices are integers >= 0"),
    ]
    # Shown rotated (its display matrix, as a phone writes it): torchcodec turns the frames,
    # mmsp's decoder does not, so the file is refused when the line is read.
    (tmp_path / "rotated.mp4").write_bytes(V.rotated_mp4(whole, -90))
    from torchcodec.decoders import VideoDecoder
    turned = VideoDecoder(str(tmp_path / "rotated.mp4"))
    assert turned.metadata.rotation == -90 and turned.get_frames_at([0]).data.shape[-2:] == (128, 96)
    cases.append(({"path": "rotated.mp4", "frame_indices": INDICES},
                  "is a video whose stream asks to be shown rotated by -90 degrees, which mmsp's decoder does not "
                  "do"))
    for video, message in cases:
        rc, err, _ = _mmsp_pixels(mmsp_bin, model_dir, tmp_path, [_line("qwen2_vl", family, cfg, grid, video)])
        assert rc == 2 and "data.jsonl:1" in err and message in err, f"{video}: rc {rc}, {err}"
    # A file cut short: its header may still be whole, so it is found when decoded, named by file.
    rc, err, _ = _mmsp_pixels(mmsp_bin, model_dir, tmp_path,
                              [_line("qwen2_vl", family, cfg, grid, {"path": "cut.mp4", "frame_indices": [0, 11]})])
    assert rc != 0 and "cut.mp4" in err, err
    # A raw h264 stream (no timestamps: decoded from its start) whose frames change size: named
    # by frame, without a timestamp (AV_NOPTS_VALUE was printed as one).
    raw = [torchcodec.encoders.VideoEncoder(_clip(w, h, seed=1, frames=3), frame_rate=8).to_tensor("h264")
           for w, h in ((128, 96), (64, 48))]
    (tmp_path / "sizes.h264").write_bytes(torch.cat(raw).numpy().tobytes())
    rc, err, _ = _mmsp_pixels(mmsp_bin, model_dir, tmp_path, [
        _line("qwen2_vl", family, cfg, [1, 8, 10], {"path": "sizes.h264", "frame_indices": [0, 4]})])
    assert rc == 2 and "sizes.h264\": frame 3 cannot be decoded: its frame (no timestamp) is 64 x 48 but the " \
        "stream's header says 128 x 96" in err and "-9223372036854775808" not in err, err


# Damaged files, as bit rot or a partial copy leaves them: one packet (the 35th of 40; key frames
# every 4) zeroed in an MP4 and overwritten with noise in a Matroska file, and an MJPEG AVI
# whose header says 1024 x 768 (its frames are 128 x 96). torchcodec's verdict on each set of
# frames is mmsp's: where it refuses them (the damage is on their way from their key frame),
# mmsp refuses, naming the line, the file and a frame asked; where it decodes them (the damage
# is in a later group), mmsp's pixels equal the processor's on torchcodec's frames. Before,
# FFmpeg's concealment handed mmsp a garbage frame, or the next frame in its place. And one
# case where mmsp is stricter: the second half of the 34th packet overwritten, which the
# decoder conceals (decode_error_flags): torchcodec hands on a frame 97 % wrong, mmsp refuses.
DAMAGED = {"damaged.mp4": ("zero", 34, [33, 34, 35]), "damaged.mkv": ("noise", 34, [32, 34, 36, 39]),
           "header.avi": (None, None, [0, 1]), "concealed.mp4": ("tail", 33, [32, 33, 34])}
SPARED = [0, 1, 2, 6]


def _damaged_files(tmp_path):
    """The files of DAMAGED, and the good file each was made from."""
    for name, (fill, packet, _) in DAMAGED.items():
        good = tmp_path / f"good.{name.split('.')[1]}"
        if fill and not good.exists():
            _write_video(good, 128, 96, seed=6, tags={"g": "4"}, frames=40)
        if fill:
            data = good.read_bytes()
            packets = (V.mp4_packets if name.endswith(".mp4") else V.mkv_packets)(data)
            assert len(packets) == 40, f"{name}: {len(packets)} packets found"
            (tmp_path / name).write_bytes(V.overwrite_packet(data, packets, packet, fill))
        else:
            _write_video(good, 128, 96, seed=6, codec="mjpeg", frames=4)
            data = bytearray(good.read_bytes())
            for box, at in ((b"avih", 32), (b"strf", 4)):  # the main header's and the stream's sizes
                offset = data.index(box) + 8 + at
                data[offset:offset + 8] = struct.pack("<ii", 1024, 768)
            (tmp_path / name).write_bytes(bytes(data))


def test_damaged_video_files_are_refused_as_torchcodec_refuses_them(tmp_path, mmsp_bin):
    from torchcodec.decoders import VideoDecoder

    family, cfg, model_dir, processor = _model("qwen2_vl", tmp_path)
    _damaged_files(tmp_path)

    def verdict(path, indices):
        """torchcodec's frames (read as transformers' read_video_torchcodec reads them), or its error."""
        try:
            return VideoDecoder(str(path), seek_mode="exact", num_ffmpeg_threads=0).get_frames_at(indices).data
        except RuntimeError as e:
            return str(e).splitlines()[-1]

    spared_lines, spared_pixels = [], []
    for name, (fill, _, indices) in DAMAGED.items():
        good = verdict(tmp_path / f"good.{name.split('.')[1]}", indices)
        grid = processor(videos=[good], do_sample_frames=False, return_tensors="pt")["video_grid_thw"][0].tolist()
        for asked in (indices, SPARED) if fill else (indices,):
            theirs = verdict(tmp_path / name, asked)
            line = _line("qwen2_vl", family, cfg, grid, {"path": name, "frame_indices": asked})
            if asked is SPARED:
                assert isinstance(theirs, torch.Tensor), f"{name} {asked}: torchcodec refused: {theirs}"
                spared_lines.append(line)
                spared_pixels.append(processor(videos=[theirs], do_sample_frames=False,
                                               return_tensors="pt")["pixel_values_videos"])
                continue
            if fill == "tail":  # torchcodec takes the concealed frame
                wrong = (theirs.int() - good.int()).abs().gt(2).flatten(1).float().mean(1).max().item()
                assert wrong > 0.5, f"{name}: torchcodec's worst frame is {wrong:.0%} off the good file's"
            else:
                assert "Invalid data found when processing input" in theirs, f"{name} {asked}: torchcodec: {theirs}"
            rc, err, _ = _mmsp_pixels(mmsp_bin, model_dir, tmp_path, [line])
            said = re.search(r'data\.jsonl:1: video 0: video file "[^"]*/' + re.escape(name) +
                             r'": frame (\d+)( \(timestamp -?\d+\))? cannot be decoded: ', err)
            assert rc == 2 and said and int(said[1]) in asked, f"{name} {asked}: rc {rc}: {err}"
            assert ("concealed errors" if fill == "tail" else "the file is damaged") in err, err
            print(f"{name} {asked}: torchcodec: {theirs if isinstance(theirs, str) else 'frames'}; mmsp: {err.strip()}")
    rc, err, got = _mmsp_pixels(mmsp_bin, model_dir, tmp_path, spared_lines)
    assert rc == 0, err
    for i, ref in enumerate(spared_pixels):
        assert torch.equal(got[f"sample{i}.video0"], ref), f"spared frames of line {i + 1} differ"


def test_pixels_out_of_memory_ends_in_one_line(tmp_path, mmsp_bin):
    """An allocation `mmsp pixels` cannot make ends it with one line and status 2, as `mmsp train`
    ends (docs/reliability.md): here the frames of a line that asks one frame of a 640 x 480 clip
    ~11,000 times, 4 GiB past the address space the process may use (RLIMIT_AS: this process's
    size, which holds LibTorch as mmsp does, + 2 GiB). Before: c10's enforce message and its
    26-frame backtrace, status 1."""
    import resource

    family, cfg, model_dir, _ = _model("qwen2_vl", tmp_path)
    _write_video(tmp_path / "big.mp4", 640, 480, seed=2, frames=1)
    size = int(re.search(r"VmSize:\s+(\d+) kB", open("/proc/self/status").read())[1]) * 1024
    limit = max(size, 3 << 30) + (2 << 30)
    n = 2 * ((limit + (4 << 30)) // (640 * 480 * 3 * 2) + 1)
    line = _line("qwen2_vl", family, cfg, [n // 2, 2, 2], {"path": "big.mp4", "frame_indices": [0] * n})
    (tmp_path / "data.jsonl").write_text(json.dumps(line) + "\n")
    r = subprocess.run([mmsp_bin, "pixels", "--model", str(model_dir / "config.json"), "--data",
                        str(tmp_path / "data.jsonl"), "--out", str(tmp_path / "pixels.safetensors")],
                       capture_output=True, text=True, timeout=120,
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
    assert r.returncode == 2, r.stderr[-3000:]
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and re.match(r"mmsp pixels: error: out of memory \(an allocation of \d+ bytes \(\d+ MiB\) "
                                        r"failed\): .* give it less at once", lines[0]), r.stderr[-3000:]
