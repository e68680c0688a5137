#!/usr/bin/env python3
"""The estimate ÷ measured table of ../memory-estimate.md from the JSON beside this file:
the script of ../memory-backward-2026-11-30/, which also reads this folder's rows."""
import pathlib
import runpy
import sys

here = pathlib.Path(__file__).parent
sys.argv = [sys.argv[0], str(here)]
runpy.run_path(str(here.parent / "memory-backward-2026-11-30" / "table.py"), run_name="__main__")
