# ccache for every compile when it is installed and no launcher is set, for mmsp's build
# and tests/fuzz's alike. Precompiled headers change every compile's input; these
# settings let ccache see through them, and must reach ccache when ninja runs it, not only
# while cmake configures. base_dir: paths under `source_dir` hash as relative to the
# build folder, so a second build folder beside the first (pip's,
# tests/package/pip_install.sh) finds its compiles.
function(mmsp_use_ccache source_dir)
  find_program(CCACHE_PROGRAM ccache)
  if(CCACHE_PROGRAM AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
    set(CMAKE_CXX_COMPILER_LAUNCHER ${CMAKE_COMMAND} -E env
        CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
        CCACHE_BASEDIR=${source_dir} ${CCACHE_PROGRAM} PARENT_SCOPE)
  endif()
endfunction()
