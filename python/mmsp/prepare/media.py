"""Image and video files: resolved, checked against what mmsp's C++ reader can read, decoded.

mmsp's trainer decodes the files named in the output with stb_image, which reads PNG, JPEG,
BMP, GIF, TGA, PSD, HDR, PIC and PNM, and ignores EXIF orientation. The processor here decodes
them with PIL, which reads more formats and applies EXIF orientation. So a file is refused
when the two would not see the same pixels' size: another format, or an EXIF rotation.
"""
import os
import re

from .errors import BadSample

# PIL's names for the formats stb_image reads too (MPO: a JPEG with extra pictures, the
# first one being what both read; PPM: PIL's name for PNM).
STB_FORMATS = {"PNG", "JPEG", "MPO", "BMP", "GIF", "TGA", "PSD", "PPM"}

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tga", ".psd", ".ppm", ".pgm", ".pnm")

_EXIF_ORIENTATION = 0x0112


def resolve(source, root, what):
    """A path as the record gives it → an absolute path (relative ones are under `root`)."""
    if not isinstance(source, str) or not source:
        raise BadSample(f"{what}: a path must be a non-empty string, not {source!r}")
    if source.startswith("file://"):
        source = source[len("file://"):]
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", source) or source.startswith("data:"):
        raise BadSample(f'{what} "{source}" is not a local file: mmsp prepare runs offline and the trainer '
                        "reads files, so download it first")
    return os.path.normpath(os.path.join(root, os.path.expanduser(source)))


def load_image(path, what):
    """Decodes one image file the way transformers' processors load a path (EXIF-transposed RGB)."""
    from PIL import Image, UnidentifiedImageError
    from transformers.image_utils import load_image as hf_load_image

    if not os.path.isfile(path):
        raise BadSample(f'{what} file "{path}" does not exist' if not os.path.exists(path)
                        else f'{what} "{path}" is not a file')
    try:
        with Image.open(path) as probe:
            fmt = probe.format
            orientation = probe.getexif().get(_EXIF_ORIENTATION, 1)
        if fmt not in STB_FORMATS:
            raise BadSample(f'{what} file "{path}" is {fmt}, which mmsp\'s image reader (stb_image) cannot read: '
                            "convert it to PNG or JPEG")
        if orientation not in (1, None):
            raise BadSample(f'{what} file "{path}" has EXIF orientation {orientation}: the processor would rotate '
                            "it but mmsp's image reader does not, so rotate the pixels in the file")
        image = hf_load_image(path)
        image.load()
        return image
    except BadSample:
        raise
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        raise BadSample(f'{what} file "{path}" cannot be decoded: {e}') from None


def video_frames(source, root, what):
    """A video → its frame files: a list of paths, or a folder whose image files are the frames
    in natural order of their names (frame_2 before frame_10)."""
    if isinstance(source, list):
        if not source:
            raise BadSample(f"{what}: the list of frames is empty")
        return [resolve(s, root, f"{what} frame {k}") for k, s in enumerate(source)]
    folder = resolve(source, root, what)
    if not os.path.isdir(folder):
        raise BadSample(f'{what} "{folder}" is not a folder of frames' + ("" if os.path.exists(folder)
                                                                          else " (it does not exist)"))
    names = [n for n in os.listdir(folder) if n.lower().endswith(IMAGE_SUFFIXES)]
    if not names:
        raise BadSample(f'{what} folder "{folder}" holds no image files')
    names.sort(key=lambda n: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", n)])
    return [os.path.join(folder, n) for n in names]
