"""`mmsp prepare`'s tests: the tiny model directories (one per family) and the image files."""
import os
import sys

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing on a hub is reachable or wanted
sys.dont_write_bytecode = True  # no __pycache__ folders in the checkout
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# The package: the build's (with mmsp._C) when CTest says where, else the checkout's
# (mmsp.prepare alone needs no build).
sys.path.insert(0, os.environ.get("MMSP_PACKAGE_PATH") or os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))

import tiny_models  # noqa: E402

# name → (width, height): sizes that give each family several grid shapes (Qwen: 2-4 merged
# rows a side, scaled up or down by the pixel budget; InternVL: 1 to 7 tiles).
IMAGES = {"cat.png": (100, 60), "dog.png": (70, 90), "big.png": (120, 120), "small.png": (30, 40),
          "tall.png": (60, 110)}


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    """family → (model directory, transformers' processor built in memory: the reference)."""
    from transformers.utils import logging

    logging.set_verbosity_error()
    root = tmp_path_factory.mktemp("models")
    return {f: (str(root / f), tiny_models.build(f, str(root / f))) for f in tiny_models.FAMILIES}


@pytest.fixture
def folder(tmp_path):
    """A folder holding the images; the tests write their input and output files here."""
    from PIL import Image, ImageDraw

    for k, (name, size) in enumerate(IMAGES.items()):
        image = Image.new("RGB", size, (40 * k, 200 - 30 * k, 90))
        ImageDraw.Draw(image).ellipse([size[0] // 4, size[1] // 4, size[0] // 2, size[1] // 2], fill=(250, 0, 0))
        image.save(tmp_path / name)
    return tmp_path
