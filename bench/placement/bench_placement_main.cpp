// bench_placement: `mmsp bench placement` without the mmsp tool (no LibTorch to link):
// prints the Markdown table, or the JSON with --json.
#include <cstring>
#include <iostream>

#include "placement_bench.h"

int main(int argc, char** argv) {
  const mmsp::bench::PlacementBenchOptions options;
  const nlohmann::json result = mmsp::bench::bench_placement(options);
  if (argc > 1 && std::strcmp(argv[1], "--json") == 0)
    std::cout << result.dump(2) << std::endl;
  else
    std::cout << mmsp::bench::placement_table(result);
  return 0;
}
