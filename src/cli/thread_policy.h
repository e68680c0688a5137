// How many threads one rank's ATen kernels use.
//
// LibTorch from the `torch` wheel runs its CPU kernels on OpenMP with a thread per core
// by default. Ranks that share a host then oversubscribe its cores: the demo's 4 ranks
// on 2 cores, 2 threads each, stepped in 2.16 s instead of 0.20 s with one thread each
// (measured 2026-11-26, LibTorch 2.15), OpenMP's waiting threads spinning on the cores
// their peers need. So each rank takes its share of the cores it may run on: the cores
// in its affinity mask divided by the ranks on its host (LOCAL_WORLD_SIZE or the
// launcher's equivalent), at least one. OMP_NUM_THREADS, when set, wins: LibTorch
// follows it (torchrun sets 1) and this does nothing.
#pragma once

namespace mmsp::cli {

// Sets ATen's intra-op threads to the rank's share of the cores unless OMP_NUM_THREADS
// is set. Returns the count it set, or 0 when it left LibTorch's choice alone (the
// variable is set, or the launcher's variables are malformed: the command reports them).
int set_rank_threads();

}  // namespace mmsp::cli
