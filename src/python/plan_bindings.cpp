// The planner from Python: a packed batch (token ids, vision grids, per-sample lengths,
// as `mmsp plan --batch` reads it) and a config.json -> this rank's shard as torch
// tensors: token ids, positions (3 mRoPE rows or 1), labels, every ring rank's share as
// (segment, order) for mmsp.ops, the split slots of an adaptive placement, the loss
// normaliser, the vision routes, and the rank's plan as `mmsp plan --format json` prints it.
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

nlohmann::json parse(const std::string& text, const char* what) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    MMSP_FAIL("mmsp.plan: the ", what, " is not JSON: ", e.what());
  }
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

py::dict plan_step(const std::string& config_json, const std::string& batch_json, int dp, int ring, int ulysses,
                   int rank, const std::string& layout, const std::string& placement) {
  const nlohmann::json config = parse(config_json, "config");
  const plan::ModelConventions conventions = model::conventions_from_config(config);
  const plan::Batch batch = plan::batch_from_json(parse(batch_json, "batch"));
  plan::PlanOptions options;
  options.mesh = {dp, ring, ulysses};
  options.layout = plan::parse_layout(layout);
  options.placement = plan::parse_placement(placement);
  std::string priced;  // the load report's bytes as `mmsp plan` prices them (its note is the CLI's)
  options.attention_shape = model::planned_attention_shape(config, "config", priced);
  plan::validate_mesh(options.mesh);
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
  d["coords"] = py::dict(py::arg("dp") = mine.coords.dp, py::arg("ring") = mine.coords.ring,
                         py::arg("ulysses") = mine.coords.ulysses);
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

}  // namespace

void bind_plan(py::module_& m) {
  m.def("model_conventions", &model_conventions, py::arg("config_json"));
  m.def("supported_model_types", &model::supported_model_types);
  m.def("plan_step", &plan_step, py::arg("config_json"), py::arg("batch_json"), py::arg("dp"), py::arg("ring"),
        py::arg("ulysses"), py::arg("rank"), py::arg("layout") = "zigzag", py::arg("placement") = "zigzag");
}

}  // namespace mmsp::python
