"""Loads mmsp._C, the C++ extension, with a message that says how to build it.

mmsp._C is compiled against one torch's C++ ABI; `_build_info.TORCH_VERSION` (written beside
it by the build) names that torch, and another one is refused here by name rather than by the
loader's missing-symbol error.
"""

import torch  # loads LibTorch and torch's pybind11 types before the extension

_BUILD = ("`pip install --no-build-isolation .` in the mmsp checkout (into the environment that holds "
          "the torch you run), or `make python` there (it builds <build>/python/mmsp and points .venv at it)")


def _same_torch(running: str, built_for: str) -> bool:
    # A build that knew only LibTorch's version (2.15.0) accepts any local variant of it.
    if "+" in built_for:
        return running == built_for
    return running.split("+")[0] == built_for


try:
    from mmsp import _build_info
except ImportError as error:  # pragma: no cover - the message is the point
    raise ImportError(
        f"mmsp's C++ extension (mmsp._C) is not built or not on the path: run {_BUILD}, or put "
        f"<build>/python on PYTHONPATH. It must be built against this torch ({torch.__version__}). "
        f"Cause: {error}"
    ) from error

if not _same_torch(torch.__version__, _build_info.TORCH_VERSION):
    raise ImportError(
        f"mmsp._C was built against torch {_build_info.TORCH_VERSION}, but this Python runs torch "
        f"{torch.__version__}: a C++ extension works only with the torch it was compiled for. Rebuild "
        f"mmsp with this torch: {_BUILD}.")

try:
    from mmsp import _C
except ImportError as error:  # pragma: no cover - the message is the point
    raise ImportError(
        f"mmsp's C++ extension (mmsp._C) could not be loaded: rebuild it with {_BUILD}. It must be "
        f"built against this torch ({torch.__version__}). Cause: {error}"
    ) from error

C = _C
