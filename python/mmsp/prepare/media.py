"""Image files and video frames: resolved, checked against what mmsp's C++ reader can read,
decoded (video files: video_file.py).

mmsp's trainer decodes the files named in the output as PIL does (src/train/data/image_file.cpp:
JPEG by libjpeg-turbo with PIL's settings, PNG, BMP, GIF, TGA, PSD and PNM by stb_image) and
ignores EXIF orientation. The processor here decodes them with PIL, which reads more formats
and applies EXIF orientation. So a file is refused when the two would not see the same pixels:
another format, an EXIF rotation, and the two modes whose PIL conversion to RGB mmsp does not
reproduce (16-bit grey, which PIL clips at 255, and CMYK JPEG); the trainer refuses those two
with the same words.

A file's width and height are read from its header and checked before anything is decoded, by
the trainer's rule (`--max-image-pixels`, the same default): a small file that declares huge
dimensions (a decompression bomb) is refused by its size, never decoded. PIL's own bomb check
(a warning above 89 M pixels, an error above twice that) is off meanwhile, as this one takes
its place with the trainer's number; should it fire anyway, that is a bad record too.
"""
import os
import re
import warnings
from typing import TYPE_CHECKING, Optional, Union

from .errors import BadSample
from .train_bounds import STB_MAX_DIMENSION

if TYPE_CHECKING:  # imported where an image is decoded
    import PIL.Image

# PIL's names for the formats stb_image reads too (MPO: a JPEG with extra pictures, the
# first one being what both read; PPM: PIL's name for PNM).
STB_FORMATS = {"PNG", "JPEG", "MPO", "BMP", "GIF", "TGA", "PSD", "PPM"}

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tga", ".psd", ".ppm", ".pgm", ".pnm")

_EXIF_ORIENTATION = 0x0112


def resolve(source: object, root: str, what: str) -> str:
    """A path as the record gives it → an absolute path (relative ones are under `root`)."""
    if not isinstance(source, str) or not source:
        raise BadSample(f"{what}: a path must be a non-empty string, not {source!r}")
    if source.startswith("file://"):
        source = source[len("file://"):]
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", source) or source.startswith("data:"):
        raise BadSample(f'{what} "{source}" is not a local file: mmsp prepare runs offline and the trainer '
                        "reads files, so download it first")
    return os.path.normpath(os.path.join(root, os.path.expanduser(source)))


def load_image(path: str, what: str, max_pixels: int) -> "PIL.Image.Image":
    """Decodes one image file the way transformers' processors load a path (EXIF-transposed RGB),
    once its header says it has at most `max_pixels` pixels."""
    from PIL import Image, UnidentifiedImageError
    from transformers.image_utils import load_image as hf_load_image

    if not os.path.isfile(path):
        raise BadSample(f'{what} file "{path}" does not exist' if not os.path.exists(path)
                        else f'{what} "{path}" is not a file')
    limit, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None  # PIL's bomb check: _check_size instead
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as probe:  # reads the header, decodes nothing
                _check_size(path, what, *probe.size, max_pixels)
                fmt = probe.format
                mode = probe.mode
                # (After the size check: a PNG's getexif decodes the image to reach a trailing eXIf.)
                orientation = probe.getexif().get(_EXIF_ORIENTATION, 1)
            if fmt not in STB_FORMATS:
                raise BadSample(f'{what} file "{path}" is {fmt}, which mmsp\'s image reader cannot read: convert '
                                "it to PNG or JPEG")
            problem = _unmatched_mode(fmt, mode)
            if problem:
                raise BadSample(f'{what} file "{path}" is {problem}')
            if orientation not in (1, None):
                raise BadSample(f'{what} file "{path}" has EXIF orientation {orientation}: the processor would '
                                "rotate it but mmsp's image reader does not, so rotate the pixels in the file")
            image = hf_load_image(path)
            image.load()
            return image
    except BadSample:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise BadSample(f'{what} file "{path}" is refused by PIL as a decompression bomb: {e}') from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError) as e:
        raise BadSample(f'{what} file "{path}" cannot be decoded: {e}') from None
    except MemoryError:
        raise BadSample(f'{what} file "{path}" does not fit in memory when decoded') from None
    finally:
        Image.MAX_IMAGE_PIXELS = limit


def _unmatched_mode(fmt: Optional[str], mode: str) -> Optional[str]:
    """Why mmsp's reader would not give the pixels PIL's convert("RGB") gives for a file of this
    format and mode, or None; the words of src/train/data/image_file.cpp."""
    if mode.startswith("I;16") or mode in ("I", "F"):
        return ("a 16-bit grey image: transformers' processors (PIL's I;16 → RGB) clip each value at 255, so all "
                "but the darkest 256 of its 65,536 levels turn white; save it with 8 bits a value (the high "
                "byte) first")
    if fmt in ("JPEG", "MPO") and mode == "CMYK":
        return ("a JPEG of 4 components in CMYK or YCCK: transformers' processors convert it to RGB by PIL's own "
                "formula, which mmsp does not reproduce; save it as an RGB JPEG or a PNG")
    return None


def _check_size(path: str, what: str, width: int, height: int, max_pixels: int) -> None:
    """mmsp train's rule (src/train/data/jsonl_dataset.cpp image_size), with its message."""
    pixels = width * height
    if pixels > max_pixels:
        raise BadSample(f'{what} file "{path}" is {width} x {height} = {pixels} pixels, more than '
                        f"--max-image-pixels {max_pixels} (decoded it would take {pixels * 3 // (1 << 20)} MiB as "
                        "RGB); shrink it or raise the limit (mmsp train needs the same --max-image-pixels)")
    if max(width, height) > STB_MAX_DIMENSION:
        raise BadSample(f'{what} file "{path}" is {width} x {height} pixels: a side over {STB_MAX_DIMENSION} is '
                        "more than mmsp's image reader (stb_image) reads")
    if not width or not height:
        raise BadSample(f'{what} file "{path}" is {width} x {height} pixels: it holds no pixel')


def video_source(source: object, root: str, what: str) -> tuple[str, Union[list[str], str]]:
    """A video as the record gives it → ("frames", its frame files) for a list of frame paths or a
    folder of them, or ("file", its absolute path) for a video file (video_file.py decodes it)."""
    if isinstance(source, list):
        if not source:
            raise BadSample(f"{what}: the list of frames is empty")
        return "frames", [resolve(s, root, f"{what} frame {k}") for k, s in enumerate(source)]
    path = resolve(source, root, what)
    if os.path.isfile(path):
        return "file", path
    return "frames", _folder_frames(path, what)


def _folder_frames(folder: str, what: str) -> list[str]:
    """A folder's image files, the frames, in natural order of their names (frame_2 before frame_10)."""
    if not os.path.isdir(folder):
        raise BadSample(f'{what} "{folder}" is neither a video file nor a folder of frames'
                        + ("" if os.path.exists(folder) else " (it does not exist)"))
    names = [n for n in os.listdir(folder) if n.lower().endswith(IMAGE_SUFFIXES)]
    if not names:
        raise BadSample(f'{what} folder "{folder}" holds no image files')
    names.sort(key=lambda n: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", n)])
    return [os.path.join(folder, n) for n in names]
