# LibTorch as mmsp builds against it: which one is found, which releases are accepted and,
# for LibTorch from a `torch` wheel, the link option that shows the linker the wheel's
# CUDA libraries. Used by this project's CMakeLists.txt and by mmspConfig.cmake alike:
#   mmsp_find_torch_prepare()   before find_package(Torch) / find_dependency(Torch)
#   mmsp_find_torch_finish()    after it

# The LibTorch releases mmsp is built and tested on (docs/building.md#libtorch-versions).
set(MMSP_TORCH_MIN_VERSION 2.11)

macro(mmsp_find_torch_prepare)
  # TorchConfig.cmake finds its Caffe2 half with find_dependency(Caffe2 PATHS <beside it>),
  # and PATHS come after the system's prefixes: with Debian's libtorch-dev installed, a
  # wheel's Torch paired with /usr's Caffe2 (1.13) and linked both. Pin the one beside.
  if(Torch_DIR AND NOT Caffe2_DIR AND EXISTS "${Torch_DIR}/../Caffe2/Caffe2Config.cmake")
    get_filename_component(Caffe2_DIR "${Torch_DIR}/../Caffe2" ABSOLUTE)
  endif()
  # Likewise its find_library(c10_LIBRARY c10 PATHS <its lib>): /usr/lib's libc10.so first.
  if(Torch_DIR AND NOT c10_LIBRARY AND EXISTS "${Torch_DIR}/../../../lib/libc10.so")
    get_filename_component(c10_LIBRARY "${Torch_DIR}/../../../lib/libc10.so" ABSOLUTE)
  endif()
endmacro()

macro(mmsp_find_torch_finish)
  if(Torch_VERSION VERSION_LESS MMSP_TORCH_MIN_VERSION)
    message(FATAL_ERROR "mmsp needs LibTorch ${MMSP_TORCH_MIN_VERSION} or newer; Torch_DIR "
                        "points at ${Torch_VERSION} (${TORCH_INSTALL_PREFIX}). `make` installs "
                        "the pinned one (requirements/torch.txt).")
  endif()
  # libstdc++ first among an executable's needed libraries: the 2.11.0 wheel's libtorch.so
  # exports a std::filesystem of its own (64 symbols; 2.15.0's none), and with libtorch.so
  # ahead of libstdc++ the loader bound mmsp's std::filesystem::remove_all to it, which
  # jumped to address 0 (test_cli's FindExecutable, on 2.11).
  if(TARGET torch AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    set_property(TARGET torch APPEND PROPERTY INTERFACE_LINK_OPTIONS
                 "SHELL:-Wl,--push-state,--no-as-needed -lstdc++ -Wl,--pop-state")
  endif()
  # A wheel's libtorch_cuda.so finds NCCL, cuDNN, cuBLAS, ... in site-packages/nvidia/*/lib
  # through its own RPATH ($ORIGIN/../../nvidia/...), and so does the loader at run time.
  # The linker, checking libtorch_cuda.so's own needs, does not expand that RPATH: it took
  # the system CUDA toolkit's older NCCL instead and failed on symbols only the wheel's
  # has (ncclCommGrow, ...). -rpath-link points it at the wheel's copies.
  get_filename_component(_mmsp_site_packages "${TORCH_INSTALL_PREFIX}/.." ABSOLUTE)
  file(GLOB _mmsp_wheel_cuda_libs LIST_DIRECTORIES true "${_mmsp_site_packages}/nvidia/*/lib")
  if(_mmsp_wheel_cuda_libs AND TARGET torch)
    list(JOIN _mmsp_wheel_cuda_libs ":" _mmsp_rpath_link)
    set_property(TARGET torch APPEND PROPERTY INTERFACE_LINK_OPTIONS
                 "LINKER:-rpath-link,${_mmsp_rpath_link}")
  endif()
endmacro()
