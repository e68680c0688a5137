"""The layer rules of docs/design.md that a grep can hold, checked over the tree.

Each rule names the files that break it; the test fails with every breach listed. Run by
ctest as `design.layer_rules` (tests/design/CMakeLists.txt), or by hand:
    python3 tests/design/layer_rules.py [ROOT]
"""

import ast
import re
import sys
from pathlib import Path

MAX_FILE_LINES = 600      # src/, include/, python/mmsp/
MAX_FUNCTION_LINES = 80   # a function's definition, first line to last

# Each library folder and the mmsp layers its files may include (docs/design.md#layers).
MAY_INCLUDE = {
    "core": {"core"},
    "plan": {"core", "plan"},
    "dist": {"core", "plan", "dist", "compat"},
    "attention": {"core", "plan", "dist", "attention", "compat"},
    "hf": {"core", "hf"},
    "model": {"core", "plan", "dist", "attention", "hf", "model", "compat"},
    "parallel": {"core", "plan", "dist", "attention", "hf", "model", "parallel", "compat"},
}
MMSP_INCLUDE = re.compile(r'#include\s+"mmsp/([a-z_]+)/')


def sources(root: Path, *folders: str, suffixes=(".h", ".cpp")) -> list[Path]:
    out = []
    for folder in folders:
        base = root / folder
        if base.exists():
            out += sorted(p for p in base.rglob("*") if p.suffix in suffixes and p.is_file())
    return out


def layer_of(root: Path, path: Path) -> str:
    parts = path.relative_to(root).parts
    return parts[2] if parts[0] == "include" else parts[1]


def check_includes(root: Path) -> list[str]:
    breaches = []
    for path in sources(root, "src", "include/mmsp"):
        layer = layer_of(root, path)
        allowed = MAY_INCLUDE.get(layer)
        if allowed is None:
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            m = MMSP_INCLUDE.match(line.strip())
            if m and m.group(1) not in allowed:
                breaches.append(f"{path.relative_to(root)}:{n}: {layer}/ includes mmsp/{m.group(1)}/, "
                                f"a layer above it (it may include {', '.join(sorted(allowed))})")
    return breaches


def grep(root: Path, pattern: str, folders: list[str], rule: str, exclude: tuple = ()) -> list[str]:
    rx = re.compile(pattern)
    breaches = []
    for path in sources(root, *folders):
        rel = str(path.relative_to(root))
        if any(rel.startswith(e) for e in exclude):
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if rx.search(line):
                breaches.append(f"{rel}:{n}: {rule}: {line.strip()}")
    return breaches


def cpp_functions(text: str):
    """(signature, first line, last line) of each function defined at namespace scope: a
    declaration beginning at column 0 (not a namespace, class, struct, enum or variable)
    whose signature ends with `{` within a few lines, up to its closing `}` at column 0.
    The code keeps such definitions unindented (namespaces do not indent), so this finds
    them without a parser."""
    lines = text.splitlines()
    skip = re.compile(r"(namespace|class|struct|enum|union|extern|using|typedef|static_assert|template\s*<.*>\s*$)\b")
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line or line[0] in " \t#/}*" or skip.match(line) or "(" not in line:
            i += 1
            continue
        j = i
        while j < len(lines) and j < i + 8 and not lines[j].rstrip().endswith(("{", ";")):
            j += 1
        if j >= len(lines) or not lines[j].rstrip().endswith("{") or re.search(r"=\s*\{$", lines[j]):
            i = j + 1
            continue
        k = j + 1
        while k < len(lines) and not lines[k].startswith("}"):
            k += 1
        yield line, i + 1, k + 1
        i = k + 1


def check_lengths(root: Path) -> list[str]:
    breaches = []
    for path in sources(root, "src", "include") + sources(root, "python/mmsp", suffixes=(".py",)):
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(root)
        n = text.count("\n")
        if n > MAX_FILE_LINES and path.suffix in (".cpp", ".py", ".h"):
            breaches.append(f"{rel}: {n} lines, over {MAX_FILE_LINES}: cut it into concepts")
        if path.suffix == ".py":
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    length = node.end_lineno - node.lineno + 1
                    if length > MAX_FUNCTION_LINES:
                        breaches.append(f"{rel}:{node.lineno}: {node.name} is {length} lines, over "
                                        f"{MAX_FUNCTION_LINES}")
        else:
            for name, first, last in cpp_functions(text):
                if last - first + 1 > MAX_FUNCTION_LINES:
                    breaches.append(f"{rel}:{first}: a function of {last - first + 1} lines, over "
                                    f"{MAX_FUNCTION_LINES}: {name.strip()}")
    return breaches


def all_breaches(root: Path) -> list[str]:
    return (
        check_includes(root)
        # model/'s step sees no process group: parallel/ hands it the attention and the router
        + grep(root, r"ContextGroups|GroupPtr|ProcessGroup", ["src/model", "include/mmsp/model"],
               "model/ names a process group")
        # plan/ is index arithmetic: no tensors, no LibTorch
        + grep(root, r"#include\s*<(ATen|torch|c10)/", ["src/plan", "include/mmsp/plan"], "plan/ includes LibTorch")
        # only cli/ reads the environment; the library is told
        + grep(root, r"\bgetenv\s*\(", ["src", "include"], "an environment read below cli/", exclude=("src/cli/",))
        # narrow includes: <torch/torch.h> costs 12-14 s a file
        + grep(root, r"#include\s*<torch/torch\.h>", ["src", "include", "bench", "tests"], "the whole of LibTorch")
        # hooks are installed by parallel::parallelize, nowhere else
        + grep(root, r"set_layer_hooks\s*\(", ["src", "include"], "hooks installed outside parallel/",
               exclude=("src/parallel/", "src/model/", "include/mmsp/model/"))
        + check_lengths(root)
    )


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[2])
    breaches = all_breaches(root)
    for b in breaches:
        print(b)
    print(f"layer rules: {len(breaches)} breach(es)")
    return 1 if breaches else 0


if __name__ == "__main__":
    sys.exit(main())
