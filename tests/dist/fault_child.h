// The rank program of the fault tests: joins the world, then one rank misbehaves.
#pragma once

#include <string>

namespace mmsp::test {
// mode "exit": rank 1 exits with status 3 while the others sit in an all_reduce.
// mode "hang": rank 1 never joins the all_reduce; the others must time out (2 s).
int run_fault_child(const std::string& mode);
}  // namespace mmsp::test
