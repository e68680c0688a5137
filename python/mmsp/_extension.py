"""Loads mmsp._C, the C++ extension, with a message that says how to build it."""

import torch  # noqa: F401  (loads LibTorch and torch's pybind11 types before the extension)

try:
    from mmsp import _C  # noqa: F401
except ImportError as error:  # pragma: no cover - the message is the point
    raise ImportError(
        "mmsp's C++ extension (mmsp._C) is not built or not on the path: run `make python` in the "
        "mmsp checkout (it builds <build>/python/mmsp and points .venv at it), or put "
        "<build>/python on PYTHONPATH. It must be built against this torch "
        f"({torch.__version__}). Cause: {error}"
    ) from error

C = _C
