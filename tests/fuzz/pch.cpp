// The precompiled header's own compile (CMakeLists.txt: fuzz_pch); nothing else.
