"""`import mmsp` on real processes (1-4, Gloo): the ops and the planner equal one process.

Each test spawns the ranks afresh (sp_ranks.py) and runs one of sp_checks.py's functions on
every rank. The package is the build's (<build>/python: the Python files with mmsp._C), which
CTest passes as MMSP_PACKAGE_PATH.
"""
import os

import pytest

import mmsp  # noqa: F401  (the build's, imported first: conftest puts MMSP_PACKAGE_PATH first)
import sp_checks
import sp_ranks

WORLDS = [1, 2, 3, 4]


@pytest.mark.parametrize("world", WORLDS)
def test_attention_equals_one_process(world, tmp_path):
    sp_ranks.run(world, sp_checks.attention_equals_one_process, tmp_path=tmp_path)


@pytest.mark.parametrize("world", WORLDS)
def test_gated_delta_equals_one_process(world, tmp_path):
    sp_ranks.run(world, sp_checks.gated_delta_equals_one_process, tmp_path=tmp_path)


@pytest.mark.parametrize("world", [2, 4])
def test_plan_equals_mmsp_plan(world, tmp_path):
    sp_ranks.run(world, sp_checks.plan_equals_mmsp_plan, os.environ["MMSP_BINARY"], tmp_path=tmp_path)


@pytest.mark.parametrize("world", [2])
def test_bad_input_is_a_value_error_on_every_rank(world, tmp_path):
    sp_ranks.run(world, sp_checks.bad_input_is_a_value_error, tmp_path=tmp_path)


def _doc_arguments(doc):
    """The argument names pybind11 writes in a function's docstring: `f(a: T, b: U = x) -> R`."""
    inside = doc.splitlines()[0].split("(", 1)[1].rsplit(") ->", 1)[0]
    names, depth, start = [], 0, 0
    for i, c in enumerate(inside + ","):
        depth += c in "[("
        depth -= c in "])"
        if c == "," and depth == 0:
            names.append(inside[start:i].split(":")[0].strip())
            start = i + 1
    return [n for n in names if n and n != "self"]


def test_the_extensions_stub_names_its_functions_and_arguments():
    # mmsp/_C.pyi (what type checkers see) against the built mmsp._C (what runs): the same
    # functions, each with the same argument names in the same order; Group's too.
    import ast

    import mmsp._extension

    ext = mmsp._extension.C
    stub_path = os.path.join(os.path.dirname(mmsp.__file__), "_C.pyi")
    tree = ast.parse(open(stub_path, encoding="utf-8").read())
    stub = {n.name: [a.arg for a in n.args.args] for n in tree.body if isinstance(n, ast.FunctionDef)}
    group = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Group")
    stub_group = {n.name: [a.arg for a in n.args.args if a.arg != "self"] for n in group.body
                  if isinstance(n, ast.FunctionDef)}
    built = {n: _doc_arguments(getattr(ext, n).__doc__) for n in dir(ext)
             if not n.startswith("_") and n != "Group"}
    assert stub == built, f"{stub_path} disagrees with mmsp._C: stub {stub}, built {built}"
    assert stub_group["__init__"] == _doc_arguments(ext.Group.__init__.__doc__)
    public = {n for n in dir(ext.Group) if not n.startswith("_")}
    assert set(stub_group) - {"__init__"} == public, (sorted(stub_group), sorted(public))
