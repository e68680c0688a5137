#!/usr/bin/env bash
# The tree's formatting, held: C++ by .clang-format (clang-format 14, Debian 12's), Python
# by ruff (pyproject.toml's [tool.ruff]). Fix what it reports with
#     git ls-files '*.cpp' '*.h' | xargs clang-format -i      .venv/bin/ruff check --fix .
# usage: style.sh ROOT PYTHON
set -euo pipefail
root=$1 python=$2
cd "$root"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t cpp < <(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')
else  # a source tree without git (an unpacked archive)
  mapfile -t cpp < <(find include src tests bench -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh')
fi
format=$(command -v clang-format || command -v clang-format-14 || true)
[ -n "$format" ] || { echo "clang-format is not installed (make deps installs it)"; exit 1; }
status=0
"$format" --style=file --dry-run --Werror "${cpp[@]}" || { echo "C++ not as .clang-format writes it: run clang-format -i on the files above"; status=1; }
"$python" -m ruff check --no-cache . || { echo "Python not as ruff wants it: run ruff check --fix ."; status=1; }
exit $status
