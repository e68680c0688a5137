"""Run by pip_install.sh with the fresh venv's Python, outside the checkout: the installed
package is the one imported (its files, version and build info), and a patched Qwen2.5-VL
step on 2 Gloo ranks (ring 2) from it equals one process (tests/python's check: the loss and
every gradient, fp64)."""
import os
import sys
from importlib import metadata


def main(site, src):
    import torch

    import mmsp
    import mmsp._extension  # noqa: F401  (loads mmsp._C: the installed one)
    from mmsp import _C, _build_info

    installed = os.path.join(os.path.realpath(site), "mmsp")
    for what, path in (("mmsp", mmsp.__file__), ("mmsp._C", _C.__file__)):
        assert os.path.dirname(os.path.realpath(path)) == installed, f"{what} came from {path}, not {installed}"
    assert os.path.isfile(os.path.join(installed, "py.typed")), "the wheel has no py.typed"
    assert metadata.version("mmsp") == mmsp.__version__, (metadata.version("mmsp"), mmsp.__version__)
    assert _build_info.TORCH_VERSION == torch.__version__, (_build_info.TORCH_VERSION, torch.__version__)
    print(f"mmsp {mmsp.__version__} from {installed}, built for torch {_build_info.TORCH_VERSION}")

    os.environ["MMSP_PACKAGE_PATH"] = site  # sp_ranks puts it first on the ranks' path
    sys.path.insert(0, os.path.join(src, "tests", "python"))
    import sp_checks
    import sp_ranks

    sp_ranks.run(2, sp_checks.patch_equals_one_process, ["qwen2_5_vl"], 2, 1, "zigzag", tmp_path=os.getcwd())
    print("a patched step from the installed package on 2 ranks = one process")


if __name__ == "__main__":  # the ranks are spawned: they import this file without running it
    main(sys.argv[1], sys.argv[2])
