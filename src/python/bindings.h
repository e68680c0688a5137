// The parts of mmsp._C (python/mmsp/), each bound in its own file; module.cpp joins them.
#pragma once

#include <torch/python.h>

namespace mmsp::python {

namespace py = pybind11;

void bind_groups(py::module_& m);  // torch_group.cpp: torch.distributed groups as mmsp groups
void bind_ops(py::module_& m);     // ops_bindings.cpp: sequence-parallel attention, Gated DeltaNet
void bind_plan(py::module_& m);    // plan_bindings.cpp: a packed batch -> this rank's shard

}  // namespace mmsp::python
