// Links the installed mmsp and uses one pure and one tensor-level API.
#include <ATen/ATen.h>

#include <cstdio>

#include "mmsp/dist/all_reduce.h"
#include "mmsp/plan/mesh.h"

int main() {
  using namespace mmsp::dist;
  mmsp::plan::validate_mesh({1, 2, 2}, 4);
  at::Tensor x = at::ones({3}, at::kDouble);
  at::Tensor y = all_reduce(x, make_solo_group("solo", 0));
  std::printf("consumer ok: %s sum %.1f\n", mmsp::plan::Mesh{1, 2, 2}.str().c_str(), y.sum().item<double>());
  return y.sum().item<double>() == 3.0 ? 0 : 1;
}
