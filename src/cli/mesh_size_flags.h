// The mesh's size flags, one per dimension and folded axis of plan::mesh_axes() (--dp, --ring,
// --ulysses, --expert): the table names them, so a new axis is a new flag with no edit here.
#pragma once

#include <CLI/CLI.hpp>
#include <algorithm>
#include <map>
#include <string>

#include "mmsp/core/check.h"
#include "mmsp/plan/mesh.h"

namespace mmsp::cli {

struct MeshSizeFlags {
  // infer_fastest: the fastest dimension (--ulysses) defaults to 0, whatever the world leaves
  explicit MeshSizeFlags(bool infer_fastest) {
    for (const plan::AxisSpec& spec : plan::mesh_axes())
      if (spec.size) sizes[spec.axis] = 1;
    if (infer_fastest) inferred = fastest_dimension();
    if (inferred) sizes[*inferred] = 0;
  }

  void add_to(CLI::App& app) {
    // Ranges are checked in check() with messages that state the rule.
    for (const plan::AxisSpec& spec : plan::mesh_axes())
      if (spec.size) app.add_option(std::string("--") + spec.name, sizes.at(spec.axis), spec.help);
  }

  void check() const {
    for (const auto& [axis, size] : sizes) {
      const bool may_infer = inferred && axis == *inferred;
      MMSP_CHECK(size >= (may_infer ? 0 : 1), "--", plan::axis_name(axis), " ", size, " must be at least 1",
                 may_infer ? " (or 0: whatever the world leaves after the other dimensions)" : "",
                 " (world = the dimensions' product)");
    }
  }

  // The mesh these flags give on `world_size` ranks (an inferred size from it), validated.
  plan::Mesh shape(int world_size) const {
    check();
    plan::Mesh s;
    for (const auto& [axis, size] : sizes) s.*plan::axis_spec(axis).size = size;
    if (inferred && sizes.at(*inferred) == 0) {
      s.*plan::axis_spec(*inferred).size = 1;
      s.*plan::axis_spec(*inferred).size = std::max(1, world_size / std::max(1, s.world()));
    }
    plan::validate_mesh(s, world_size);
    return s;
  }

  std::map<plan::MeshAxis, int> sizes;  // by axis; a flag writes its value here
  std::optional<plan::MeshAxis> inferred;

 private:
  static plan::MeshAxis fastest_dimension() {
    plan::MeshAxis last = plan::MeshAxis::world;
    for (const plan::AxisSpec& spec : plan::mesh_axes())
      if (spec.kind == plan::AxisKind::dimension) last = spec.axis;
    return last;
  }
};

}  // namespace mmsp::cli
