"""Where the tests find mmsp: MMSP_BIN (the mmsp tool) and MMSP_RUN (mmsp-run), which
CTest sets (tests/hf/CMakeLists.txt); the defaults are the Makefile's build folder."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing on a hub is reachable or wanted

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="session")
def mmsp_bin():
    path = os.environ.get("MMSP_BIN", os.path.join(REPO, "build", "mmsp"))
    assert os.access(path, os.X_OK), f"MMSP_BIN={path} is not an executable mmsp (build it first)"
    return path


@pytest.fixture(scope="session")
def mmsp_run():
    path = os.environ.get("MMSP_RUN", os.path.join(REPO, "build", "mmsp-run"))
    assert os.access(path, os.X_OK), f"MMSP_RUN={path} is not an executable mmsp-run (build it first)"
    return path
