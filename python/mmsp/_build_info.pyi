# _build_info.py is written by the build beside mmsp._C (src/python/_build_info.py.in).
TORCH_VERSION: str
