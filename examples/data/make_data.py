# Generates examples/data (run from this folder: python3 make_data.py): tiny PNGs and
# data.jsonl for configs/tiny-qwen2-vl.json, with no dependency beyond the standard library.
import json
import struct
import zlib


def png(path, w, h, pixel):
    raw = b"".join(b"\x00" + bytes(c for x in range(w) for c in pixel(x + 0.5, y + 0.5)) for y in range(h))
    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)
    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) \
        + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
    open(path, "wb").write(data)

BG = (40, 40, 40)
def circle(cx, cy, r, col):
    return lambda x, y: col if (x - cx) ** 2 + (y - cy) ** 2 <= r * r else BG
def square(cx, cy, r, col):
    return lambda x, y: col if abs(x - cx) <= r and abs(y - cy) <= r else BG
def triangle(cx, cy, r, col):
    return lambda x, y: col if abs(y - cy) <= r and abs(x - cx) <= (y - cy + r) / 2 else BG

png("circle.png", 56, 56, circle(28, 28, 12, (255, 0, 0)))        # big red circle, centre
png("square.png", 70, 50, square(18, 25, 6, (0, 0, 255)))         # small blue square, left; 70 x 50: needs a grid
png("triangle.png", 56, 112, triangle(28, 30, 12, (0, 255, 0)))   # big green triangle, top
png("move_0.png", 56, 56, circle(17, 28, 6, (255, 255, 0)))       # small yellow circle moving right
png("move_1.png", 56, 56, circle(28, 28, 6, (255, 255, 0)))
png("move_2.png", 56, 56, circle(39, 28, 6, (255, 255, 0)))

# the built-in word tokenizer's vocabulary (src/train/data/word_tokenizer.cpp), ids 0..N-1
vocab = ["<pad>", "<bos>", "<eos>", "a", "and", "small", "big", "red", "green", "blue", "yellow",
         "white", "magenta", "circle", "square", "triangle", "cross", "on", "at", "in", "the",
         "left", "right", "top", "bottom", "centre", "moves", "up", "down"]
ids = {w: i for i, w in enumerate(vocab)}
START, END, IMAGE, VIDEO = 151652, 151653, 151655, 151656

def sample(blocks, caption, images=None, image_grid=None, videos=None, video_grid=None, mask=True):
    prompt = [1]
    for pad, n in blocks:
        prompt += [START] + [pad] * n + [END]
    text = [ids[w] for w in caption.split()] + [2]
    s = {"input_ids": prompt + text}
    if mask:
        s["loss_mask"] = [0] * len(prompt) + [1] * len(text)
    if images:
        s["images"] = images
    if image_grid:
        s["image_grid_thw"] = image_grid
    if videos:
        s["videos"] = videos
    if video_grid:
        s["video_grid_thw"] = video_grid
    return s

lines = [
    # grid from the file: 56 x 56 px = 4 x 4 patches of 14 = 2 x 2 merged tokens
    sample([(IMAGE, 4)], "a big red circle in the centre", images=[{"path": "circle.png"}]),
    # 70 x 50 px is no multiple of 28: the grid says how to resize it (to 84 x 56 px)
    sample([(IMAGE, 6)], "a small blue square on the left", images=[{"path": "square.png"}],
           image_grid=[[1, 4, 6]]),
    # two images; 56 x 112 px = grid [1, 8, 4] = 8 tokens
    sample([(IMAGE, 4), (IMAGE, 8)], "a big red circle in the centre and a big green triangle at the top",
           images=[{"path": "circle.png"}, {"path": "triangle.png"}], mask=False),
    # a video of 3 frames: 2 temporal patches (the last frame repeated), grid [2, 4, 4] = 8 tokens
    sample([(VIDEO, 8)], "a small yellow circle moves right",
           videos=[{"frames": ["move_0.png", "move_1.png", "move_2.png"]}]),
]
with open("data.jsonl", "w") as f:
    for s in lines:
        f.write(json.dumps(s, separators=(",", ":")) + "\n")
