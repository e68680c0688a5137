"""`import mmsp` on real processes (1-4, Gloo): the ops and the planner equal one process.

Each test spawns the ranks afresh (sp_ranks.py) and runs one of sp_checks.py's functions on
every rank. The package is the build's (<build>/python: the Python files with mmsp._C), which
CTest passes as MMSP_PACKAGE_PATH.
"""
import os

import pytest

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
