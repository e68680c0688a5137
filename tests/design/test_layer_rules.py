"""design.layer_rules: the tree keeps the layer rules, and each rule's check finds a breach."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import layer_rules  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_the_tree_keeps_every_rule():
    assert layer_rules.all_breaches(ROOT) == []


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def test_each_rule_finds_its_breach(tmp_path):
    long_body = "".join(f"  x += {i};\n" for i in range(90))
    write(tmp_path, "src/model/layers/bad.cpp",
          '#include "mmsp/train/trainer.h"\nvoid f(dist::GroupPtr g) {\n}\n')
    write(tmp_path, "src/plan/bad.cpp", "#include <ATen/ATen.h>\n")
    write(tmp_path, "src/train/bad.cpp", 'const char* v = std::getenv("X");\n#include <torch/torch.h>\n')
    write(tmp_path, "src/train/hooks.cpp", "void g(Vlm& v) {\n  v.set_layer_hooks(nullptr);\n}\n")
    write(tmp_path, "src/dist/long.cpp", "int long_one(int x,\n             int y) {\n" + long_body + "}\n")
    write(tmp_path, "python/mmsp/long.py", "def f():\n" + "".join(f"    x = {i}\n" for i in range(85)))
    write(tmp_path, "src/cli/ok.cpp", 'const char* v = std::getenv("X");\n')  # cli/ may read it
    found = "\n".join(layer_rules.all_breaches(tmp_path))
    assert "model/ includes mmsp/train/" in found
    assert "model/ names a process group" in found
    assert "plan/ includes LibTorch" in found
    assert "src/train/bad.cpp:1: an environment read below cli/" in found
    assert "src/cli/ok.cpp" not in found
    assert "the whole of LibTorch" in found
    assert "hooks installed outside parallel/" in found
    assert "src/dist/long.cpp:1: a function of 93 lines" in found
    assert "python/mmsp/long.py:1: f is 86 lines" in found
