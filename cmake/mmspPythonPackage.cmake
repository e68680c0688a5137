# The Python package built by pip (pyproject.toml, scikit-build-core; MMSP_PYTHON_PACKAGE=ON).
# mmsp._C is C++ against LibTorch's ABI: it works only with the torch it was built against.
# So the build takes LibTorch from the torch of the Python that runs it (the user's
# environment, hence `pip install --no-build-isolation`), never from a torch that pip's
# isolated build environment would download for the occasion.

macro(mmsp_python_package_find_torch)
  # scikit-build-core names the Python it builds for; a hand-run configure may name MMSP_PYTHON.
  if(NOT MMSP_PYTHON)
    if(Python_EXECUTABLE)
      set(MMSP_PYTHON "${Python_EXECUTABLE}")
    elseif(Python3_EXECUTABLE)
      set(MMSP_PYTHON "${Python3_EXECUTABLE}")
    else()
      message(FATAL_ERROR "mmsp: MMSP_PYTHON_PACKAGE needs the Python to build for: "
                          "build with pip (`pip install --no-build-isolation .`) or pass -DMMSP_PYTHON=<python>")
    endif()
  endif()
  set(MMSP_PYTHON "${MMSP_PYTHON}" CACHE FILEPATH "The Python the package is built for" FORCE)
  set(Python3_EXECUTABLE "${MMSP_PYTHON}")
  if(NOT Torch_DIR)
    execute_process(
      COMMAND "${MMSP_PYTHON}" -c "import torch; print(torch.utils.cmake_prefix_path)"
      OUTPUT_VARIABLE mmsp_torch_prefix ERROR_VARIABLE mmsp_torch_error
      RESULT_VARIABLE mmsp_torch_rc OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(NOT mmsp_torch_rc EQUAL 0)
      message(FATAL_ERROR
        "mmsp: the Python that builds the package (${MMSP_PYTHON}) cannot import torch. mmsp._C "
        "is built against the torch it will run with: install torch first (requirements/torch.txt "
        "has the tested pin), then `pip install --no-build-isolation .` in that environment "
        "(an isolated build would compile against a torch of its own). Python said:\n${mmsp_torch_error}")
    endif()
    set(Torch_DIR "${mmsp_torch_prefix}/Torch" CACHE PATH "LibTorch of the building Python's torch" FORCE)
  endif()
endmacro()
