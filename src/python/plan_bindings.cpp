// The planner from Python: a packed batch (token ids, vision grids, per-sample lengths,
// as `mmsp plan --batch` reads it) and a config.json -> this rank's shard as torch
// tensors: token ids, positions (3 mRoPE rows or 1), labels, every ring rank's share as
// (segment, order) for mmsp.ops, the split slots of an adaptive placement, the loss
// normaliser, the vision routes, and the rank's plan as `mmsp plan --format json` prints it.
#include <map>
#include <optional>

#include <nlohmann/json.hpp>

#include "bindings.h"
#include "mmsp/core/check.h"
#include "mmsp/model/family.h"
#include "mmsp/model/rank_inputs.h"
#include "mmsp/plan/mesh.h"
#include "mmsp/plan/placement.h"
#include "mmsp/plan/plan_json.h"
#include "mmsp/plan/step_plan.h"

namespace mmsp::python {

namespace {

// "dp, ring, ulysses, expert": the axes a size is given for.
std::string axis_names() {
  std::string out;
  for (const plan::AxisSpec& spec : plan::mesh_axes())
    if (spec.size) out += (out.empty() ? "" : ", ") + std::string(spec.name);
  return out;
}

nlohmann::json parse(const std::string& text, const char* what) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) { MMSP_FAIL("mmsp.plan: the ", what, " is not JSON: ", e.what()); }
  return {};
}

py::list routes_to_python(const std::vector<std::vector<plan::RouteRow>>& by_rank) {
  py::list out;
  for (const auto& rows : by_rank) {
    py::list rank;
    for (const plan::RouteRow& r : rows)
      rank.append(py::dict(py::arg("item") = r.item, py::arg("row") = r.row, py::arg("src_row") = r.src_row,
                           py::arg("slot") = r.slot));
    out.append(rank);
  }
  return out;
}

// The mesh of {axis name: size} (plan::mesh_axes()'s dimension and folded names; an axis
// left out is 1); an unknown name is an error naming the known ones.
plan::Mesh mesh_of(const std::map<std::string, int>& sizes, const char* what) {
  plan::Mesh mesh;
  for (const auto& [name, size] : sizes) {
    const std::optional<plan::MeshAxis> axis = plan::axis_named(name);
    MMSP_CHECK(axis && plan::axis_spec(*axis).size, what, ": '", name, "' is not a mesh axis with a size of its own (",
               axis_names(), ")");
    mesh.*plan::axis_spec(*axis).size = size;
  }
  plan::validate_mesh(mesh);
  return mesh;
}

py::dict plan_step(const std::string& config_json, const std::string& batch_json,
                   const std::map<std::string, int>& mesh_sizes, int rank, const std::string& layout,
                   const std::string& placement) {
  const nlohmann::json config = parse(config_json, "config");
  const plan::ModelConventions conventions = model::conventions_from_config(config);
  const plan::Batch batch = plan::batch_from_json(parse(batch_json, "batch"));
  plan::PlanOptions options;
  options.mesh = mesh_of(mesh_sizes, "mmsp.plan");
  options.layout = plan::parse_layout(layout);
  options.placement = plan::parse_placement(placement);
  std::string priced;  // the load report's bytes as `mmsp plan` prices them (its note is the CLI's)
  options.attention_shape = model::planned_attention_shape(config, "config", priced);
  MMSP_CHECK(rank >= 0 && rank < options.mesh.world(), "mmsp.plan: rank ", rank, " is outside the mesh ",
             options.mesh.str(), " of ", options.mesh.world(), " ranks");
  const plan::StepPlan step = plan::make_step_plan(batch, conventions, options, rank);
  const model::RankInputs in = model::rank_inputs(batch, step);
  py::list segments, orders;
  for (const auto& share : in.ring_shares) {
    segments.append(share.segment);
    orders.append(share.order);
  }
  const plan::RankPlan& mine = step.mine;
  py::dict d;
  d["rank"] = mine.rank;
  py::dict coords;
  for (const plan::AxisSpec& spec : plan::mesh_axes())
    if (spec.coordinate) coords[spec.name] = mine.coords.*spec.coordinate;
  d["coords"] = coords;
  d["token_ids"] = in.token_ids;
  d["positions"] = in.positions;
  d["labels"] = in.labels;
  d["segments"] = segments;
  d["orders"] = orders;
  d["split_slots"] = in.split_slots;
  d["label_count"] = in.label_count;
  d["packed_index"] = mine.tokens;  // slot -> index in the packed row, -1 for padding
  // slot -> (batch sequence, index in it), -1 for padding: how a user gathers per-sample tensors
  const plan::RowPlan& row = step.rows.at(mine.coords.dp);
  std::vector<int64_t> sequence(mine.local_length, -1), index(mine.local_length, -1);
  for (int64_t slot = 0; slot < mine.local_length; ++slot) {
    const int32_t seg = mine.segment_ids[slot];
    if (seg < 0) continue;
    const plan::Segment& segment = row.packing.segments.at(seg);
    if (mine.segment_index[slot] >= segment.length) continue;  // the segment's own padding
    sequence[slot] = segment.sequence;
    index[slot] = mine.segment_index[slot];
  }
  d["sequence"] = sequence;
  d["index_in_sequence"] = index;
  d["encoder_items"] = mine.routes.encoder_items;
  d["encoder_rows"] = mine.routes.encoder_rows;
  d["visual_slots"] = mine.routes.visual_slots;
  d["send"] = routes_to_python(mine.routes.send);
  d["recv"] = routes_to_python(mine.routes.recv);
  d["plan_json"] = plan::step_plan_to_json(batch, step, {rank}).dump();
  return d;
}

// What mmsp.patch needs to know of a family, from the model layer's registry (the one
// table of families, shared with `mmsp train` and the planner): the conventions a
// config.json gives. An unsupported model_type is an error listing the supported ones.
py::dict model_conventions(const std::string& config_json) {
  const plan::ModelConventions c = model::conventions_from_config(parse(config_json, "config"));
  py::dict d;
  d["name"] = c.name;
  d["mrope"] = c.uses_mrope();
  d["frames_as_blocks"] = c.frames_as_blocks;
  d["video_time_scaled"] = c.video_time_scaled;
  d["image_token_id"] = c.image_token_id;
  d["video_token_id"] = c.video_token_id;
  d["vision_start_token_id"] = c.vision_start_token_id;
  d["vision_end_token_id"] = c.vision_end_token_id;
  d["class_rows"] = c.class_rows;
  d["spatial_merge_size"] = c.spatial_merge_size;
  return d;
}

// The mesh's axes as mmsp.Mesh reads them: [{name, kind, has_size, help}], in the order
// every rank builds their groups.
py::list mesh_axes() {
  py::list axes;
  for (const plan::AxisSpec& spec : plan::mesh_axes()) {
    const char* kind = spec.kind == plan::AxisKind::dimension   ? "dimension"
                       : spec.kind == plan::AxisKind::flattened ? "flattened"
                                                                : "folded";
    axes.append(py::dict(py::arg("name") = spec.name, py::arg("label") = spec.label, py::arg("kind") = kind,
                         py::arg("has_size") = spec.size != nullptr, py::arg("help") = spec.help));
  }
  return axes;
}

// The global ranks of `axis`'s group that holds `rank` (plan::group_members), in group order.
std::vector<int> mesh_group_members(const std::map<std::string, int>& sizes, const std::string& axis, int rank) {
  const std::optional<plan::MeshAxis> a = plan::axis_named(axis);
  MMSP_CHECK(a.has_value(), "mmsp.Mesh: no mesh axis is named '", axis, "' (", axis_names(), ")");
  return plan::group_members(mesh_of(sizes, "mmsp.Mesh"), *a, rank);
}

// {axis name: this rank's coordinate} on every dimension.
py::dict mesh_rank_coords(const std::map<std::string, int>& sizes, int rank) {
  const plan::RankCoords c = plan::rank_coords(mesh_of(sizes, "mmsp.Mesh"), rank);
  py::dict coords;
  for (const plan::AxisSpec& spec : plan::mesh_axes())
    if (spec.coordinate) coords[spec.name] = c.*spec.coordinate;
  return coords;
}

std::string mesh_group_name(const std::map<std::string, int>& sizes, const std::string& axis, int rank) {
  const std::optional<plan::MeshAxis> a = plan::axis_named(axis);
  MMSP_CHECK(a.has_value(), "mmsp.Mesh: no mesh axis is named '", axis, "' (", axis_names(), ")");
  return plan::group_name(mesh_of(sizes, "mmsp.Mesh"), *a, rank);
}

}  // namespace

void bind_plan(py::module_& m) {
  m.def("mesh_rank_coords", &mesh_rank_coords, py::arg("sizes"), py::arg("rank"));
  m.def("mesh_group_name", &mesh_group_name, py::arg("sizes"), py::arg("axis"), py::arg("rank"));
  m.def("mesh_axes", &mesh_axes);
  m.def("mesh_group_members", &mesh_group_members, py::arg("sizes"), py::arg("axis"), py::arg("rank"));
  m.def("model_conventions", &model_conventions, py::arg("config_json"));
  m.def("supported_model_types", &model::supported_model_types);
  m.def("plan_step", &plan_step, py::arg("config_json"), py::arg("batch_json"), py::arg("mesh"), py::arg("rank"),
        py::arg("layout") = "zigzag", py::arg("placement") = "zigzag");
}

}  // namespace mmsp::python
