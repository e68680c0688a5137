// mmsp._C: mmsp's C++ behind the `mmsp` Python package. It is built against the LibTorch
// inside the user's `torch` wheel, so tensors cross as they are (no copy) and collectives
// run on the user's own torch.distributed process groups (no second c10d world).
// mmsp::Error, a user's mistake whose message names the value and the rule, becomes
// ValueError; anything else keeps pybind11's mapping (RuntimeError).
#include <torch/python.h>

#include "bindings.h"
#include "mmsp/core/check.h"

PYBIND11_MODULE(_C, m) {
  namespace py = pybind11;
  m.doc() = "mmsp's C++ core: sequence-parallel ops and the planner (see docs/python.md)";
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const mmsp::Error& e) { PyErr_SetString(PyExc_ValueError, e.what()); }
  });
  mmsp::python::bind_groups(m);
  mmsp::python::bind_ops(m);
  mmsp::python::bind_plan(m);
}
