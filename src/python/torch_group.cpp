// torch.distributed process groups as mmsp groups. An mmsp dist::Group is a view of
// c10d backends (Gloo for CPU tensors, NCCL for CUDA ones) with a name, its members'
// global ranks, a timeout and byte counters; here its backends are those of the user's
// ProcessGroup, so mmsp's collectives travel on the user's group (no second world).
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <chrono>
#include <cmath>

#include "bindings.h"
#include "mmsp/core/check.h"
#include "mmsp/dist/comm_stats.h"
#include "mmsp/dist/group.h"

namespace mmsp::python {

namespace {

c10::intrusive_ptr<c10d::Backend> backend_or_null(const c10::intrusive_ptr<c10d::ProcessGroup>& pg,
                                                  c10::DeviceType device) {
  return pg->hasBackendForDeviceType(device) ? pg->getBackend(device) : c10::intrusive_ptr<c10d::Backend>();
}

dist::GroupPtr group_from_torch(const py::object& process_group, std::vector<int> members, const std::string& name,
                                double timeout_s) {
  MMSP_CHECK(std::isfinite(timeout_s) && timeout_s > 0, "mmsp.Group: timeout ", timeout_s,
             " s must be a positive number of seconds");
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  try {
    pg = process_group.cast<c10::intrusive_ptr<c10d::ProcessGroup>>();
  } catch (const py::cast_error&) {
    MMSP_FAIL("mmsp.Group: ", std::string(py::str(py::type::of(process_group))),
              " is not a torch.distributed ProcessGroup");
  }
  const int size = pg->getSize(), rank = pg->getRank();
  MMSP_CHECK(static_cast<int>(members.size()) == size, "mmsp.Group: ", members.size(),
             " member ranks given for a process group of ", size);
  auto cpu = backend_or_null(pg, c10::DeviceType::CPU), gpu = backend_or_null(pg, c10::DeviceType::CUDA);
  MMSP_CHECK(size == 1 || cpu || gpu, "mmsp.Group: process group ", name, " has no backend for CPU or CUDA tensors");
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(std::llround(timeout_s * 1000)));
  return c10::make_intrusive<dist::Group>(name, std::move(members), rank, cpu, gpu, std::make_shared<dist::CommStats>(),
                                          timeout);
}

}  // namespace

void bind_groups(py::module_& m) {
  py::class_<dist::Group, c10::intrusive_ptr<dist::Group>>(m, "Group",
                                                           "a torch.distributed process group as mmsp sees it")
      .def(py::init(&group_from_torch), py::arg("process_group"), py::arg("members"), py::arg("name"),
           py::arg("timeout_s"))
      .def_property_readonly("name", &dist::Group::name)
      .def_property_readonly("rank", &dist::Group::rank)
      .def_property_readonly("size", &dist::Group::size)
      .def_property_readonly("members", &dist::Group::members)
      .def(
          "bytes_sent", [](const dist::Group& g) { return g.stats().snapshot().total_bytes(); },
          "bytes this rank sent to others through mmsp's collectives on this group")
      .def("reset_bytes", [](const dist::Group& g) { g.stats().reset(); });
}

}  // namespace mmsp::python
