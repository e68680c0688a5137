// batch.json in, plan JSON and text summary out (schemas in docs/plan-command.md).
#include "mmsp/plan/plan_json.h"

#include <cstdio>
#include <sstream>

#include "mmsp/core/check.h"
#include "mmsp/plan/model_conventions.h"

namespace mmsp::plan {

namespace {

using nlohmann::json;

std::vector<int64_t> int_list(const json& j, int64_t si, const char* field) {
  MMSP_CHECK(j.is_array(), "sequence ", si, ": ", field, " must be an array, got ", j.type_name());
  std::vector<int64_t> out;
  out.reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    MMSP_CHECK(j[i].is_number_integer(), "sequence ", si, ": ", field, "[", i, "] must be an integer, got ",
               j[i].dump());
    // nlohmann reads 2^64-1 as an unsigned that get<int64_t>() would turn into -1.
    MMSP_CHECK(!j[i].is_number_unsigned() || j[i].get<uint64_t>() <= uint64_t{INT64_MAX}, "sequence ", si, ": ", field,
               "[", i, "] = ", j[i].dump(), " is beyond the int64 range");
    out.push_back(j[i].get<int64_t>());
  }
  return out;
}

std::vector<Grid> grid_list(const json& j, int64_t si, const char* field) {
  MMSP_CHECK(j.is_array(), "sequence ", si, ": ", field, " must be an array of [t, h, w], got ", j.type_name());
  std::vector<Grid> out;
  for (size_t i = 0; i < j.size(); ++i) {
    MMSP_CHECK(j[i].is_array() && j[i].size() == 3, "sequence ", si, ": ", field, "[", i, "] must be [t, h, w], got ",
               j[i].dump());
    Grid g;
    for (int k = 0; k < 3; ++k) {
      MMSP_CHECK(j[i][k].is_number_integer(), "sequence ", si, ": ", field, "[", i, "] must hold integers, got ",
                 j[i].dump());
      g[k] = j[i][k].get<int64_t>();
    }
    out.push_back(g);
  }
  return out;
}

json grid_json(const Grid& g) { return json::array({g[0], g[1], g[2]}); }

}  // namespace

Batch batch_from_json(const json& j) {
  MMSP_CHECK(j.is_object() && j.contains("sequences") && j.at("sequences").is_array(),
             "batch.json must be {\"sequences\": [...]}");
  Batch batch;
  const json& seqs = j.at("sequences");
  MMSP_CHECK(!seqs.empty(), "batch is empty: it needs at least one sequence");
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int64_t si = static_cast<int64_t>(i);
    const json& s = seqs[i];
    MMSP_CHECK(s.is_object() && s.contains("input_ids"), "sequence ", si, ": must be an object with \"input_ids\"");
    Sequence seq;
    seq.input_ids = int_list(s.at("input_ids"), si, "input_ids");
    for (size_t k = 0; k < seq.input_ids.size(); ++k)
      MMSP_CHECK(seq.input_ids[k] >= 0, "sequence ", si, ": input_ids[", k, "] = ", seq.input_ids[k],
                 " is not a token id (ids are >= 0)");
    if (s.contains("image_grid_thw") && !s.at("image_grid_thw").is_null())
      seq.image_grid_thw = grid_list(s.at("image_grid_thw"), si, "image_grid_thw");
    if (s.contains("video_grid_thw") && !s.at("video_grid_thw").is_null())
      seq.video_grid_thw = grid_list(s.at("video_grid_thw"), si, "video_grid_thw");
    if (s.contains("second_per_grid_ts") && !s.at("second_per_grid_ts").is_null()) {
      const json& t = s.at("second_per_grid_ts");
      MMSP_CHECK(t.is_array(), "sequence ", si, ": second_per_grid_ts must be an array");
      for (size_t k = 0; k < t.size(); ++k) {
        MMSP_CHECK(t[k].is_number() && t[k].get<double>() >= 0 && t[k].get<double>() <= kMaxSecondsPerGrid, "sequence ",
                   si, ": second_per_grid_ts[", k, "] must be a number of seconds in [0, ", kMaxSecondsPerGrid,
                   "], got ", t[k].dump(), " (it scales video positions)");
        seq.second_per_grid_ts.push_back(t[k].get<double>());
      }
    }
    if (s.contains("loss_mask") && !s.at("loss_mask").is_null()) {
      seq.loss_mask = int_list(s.at("loss_mask"), si, "loss_mask");
      // An empty mask would read as "no mask" below: a wrong length, not a default.
      MMSP_CHECK(!seq.loss_mask.empty() || seq.input_ids.empty(), "sequence ", si,
                 ": loss_mask has 0 entries but input_ids has ", seq.input_ids.size(),
                 "; give one 0/1 per token, or leave loss_mask out to train on every token");
    }
    batch.sequences.push_back(std::move(seq));
  }
  return batch;
}

json rank_plan_to_json(const StepPlan& plan, const RankPlan& rp) {
  const Mesh& mesh = plan.options.mesh;
  auto global_rank_of_context_rank = [&](int context_rank) {
    RankCoords c = rp.coords;
    c.ring = context_rank / mesh.ulysses;
    c.ulysses = context_rank % mesh.ulysses;
    return global_rank(mesh, c);
  };
  json j;
  j["rank"] = rp.rank;
  j["coords"] = {{"dp", rp.coords.dp},
                 {"ring", rp.coords.ring},
                 {"ulysses", rp.coords.ulysses},
                 {"context_rank", rp.coords.context_rank(mesh)}};
  j["tokens"] = rp.tokens;
  j["segment_ids"] = rp.segment_ids;
  j["segment_index"] = rp.segment_index;
  json positions = json::array();
  for (int r = 0; r < rp.position_rows; ++r)
    positions.push_back(std::vector<int64_t>(rp.positions.begin() + r * rp.local_length,
                                             rp.positions.begin() + (r + 1) * rp.local_length));
  j["positions"] = positions;
  j["labels"] = rp.labels;
  j["images"] = rp.routes.encoder_items;
  j["encoder_rows"] = rp.routes.encoder_rows;
  j["visual_slots"] = rp.routes.visual_slots;
  json send = json::array(), recv = json::array();
  for (size_t d = 0; d < rp.routes.send.size(); ++d) {
    const auto& rows = rp.routes.send[d];
    if (rows.empty()) continue;
    json items = json::array(), src_rows = json::array(), slots = json::array();
    for (const RouteRow& r : rows) {
      items.push_back({r.item, r.row});
      src_rows.push_back(r.src_row);
      slots.push_back(r.slot);
    }
    send.push_back({{"to", global_rank_of_context_rank(static_cast<int>(d))},
                    {"rows", items},
                    {"src_rows", src_rows},
                    {"dst_slots", slots}});
  }
  for (size_t s = 0; s < rp.routes.recv.size(); ++s) {
    const auto& rows = rp.routes.recv[s];
    if (rows.empty()) continue;
    json items = json::array(), slots = json::array();
    for (const RouteRow& r : rows) {
      items.push_back({r.item, r.row});
      slots.push_back(r.slot);
    }
    recv.push_back({{"from", global_rank_of_context_rank(static_cast<int>(s))}, {"rows", items}, {"slots", slots}});
  }
  j["send"] = send;
  j["recv"] = recv;
  return j;
}

json step_plan_to_json(const Batch& batch, const StepPlan& plan, const std::vector<int>& ranks) {
  const Mesh& mesh = plan.options.mesh;
  json j;
  j["model_type"] = plan.conventions.name;
  j["mesh"] = {{"dp", mesh.dp}, {"ring", mesh.ring}, {"ulysses", mesh.ulysses}, {"world", mesh.world()}};
  j["layout"] = to_string(plan.options.layout);
  j["placement"] = to_string(plan.options.placement);
  json segments = json::array(), cu = json::array(), pos = json::array(), items = json::array(),
       balance = json::array(), local = json::array();
  for (const RowPlan& row : plan.rows) {
    for (const Segment& s : row.packing.segments)
      segments.push_back({{"dp", row.dp},
                          {"sequence", s.sequence},
                          {"start", s.start},
                          {"length", s.length},
                          {"padded_length", s.padded_length},
                          {"home", s.home}});
    cu.push_back(row.packing.cu_seqlens);
    local.push_back(row.shards.local_length());
    const std::vector<int64_t> p = row_position_ids(plan, row.dp);
    const int nrows = plan.conventions.uses_mrope() ? 3 : 1;
    json rows = json::array();
    for (int r = 0; r < nrows; ++r)
      rows.push_back(
          std::vector<int64_t>(p.begin() + r * row.packing.length, p.begin() + (r + 1) * row.packing.length));
    pos.push_back(rows);
    for (size_t i = 0; i < row.items.size(); ++i) {
      const VisionItem& it = row.items[i];
      items.push_back({{"dp", row.dp},
                       {"item", i},
                       {"sequence", it.sequence},
                       {"kind", to_string(it.kind)},
                       {"index", it.index},
                       {"batch_index", it.batch_index},
                       {"grid_thw", grid_json(it.grid)},
                       {"rows", it.rows},
                       {"patches", it.patches},
                       {"patch_offset", it.patch_offset},
                       {"cost", it.cost},
                       {"encoder_rank", it.encoder_rank},
                       {"greedy_rank", row.greedy_rank[i]},
                       {"preferred_rank", it.preferred_rank}});
      if (it.split()) items.back()["shard_rows"] = it.shard_rows;  // vision-tower SP
    }
    const LoadReport& l = row.load;
    balance.push_back({{"dp", row.dp},
                       {"tokens", l.tokens},
                       {"padding", l.padding},
                       {"attention_pairs", l.pairs},
                       {"ulysses_bytes", l.ulysses_bytes},
                       {"ring_bytes", l.ring_bytes},
                       {"whole_segments", l.whole_segments},
                       {"split_segments", l.split_segments},
                       {"split_vision_items", l.split_items},
                       {"vision_kept_whole", row.vision_kept_whole},
                       {"vision_cost", l.vision_cost},
                       {"greedy_vision_cost", l.greedy_vision_cost},
                       {"tokens_max_over_mean", l.tokens_ratio},
                       {"attention_max_over_mean", l.pairs_ratio},
                       {"vision_max_over_mean", l.vision_ratio},
                       {"greedy_vision_max_over_mean", l.greedy_vision_ratio},
                       {"used_greedy_fallback", row.used_greedy_fallback}});
  }
  j["segments"] = segments;
  j["cu_seqlens"] = cu;
  j["local_length"] = local;
  j["position_ids"] = pos;
  j["rope_deltas"] = plan.rope_deltas;
  j["label_count"] = plan.label_count;
  j["vision_items"] = items;
  json rank_list = json::array();
  for (int r : ranks) {
    const RankPlan rp = r == plan.mine.rank ? plan.mine : make_rank_plan(batch, plan, r);
    rank_list.push_back(rank_plan_to_json(plan, rp));
  }
  j["ranks"] = rank_list;
  j["balance"] = balance;
  return j;
}

std::string step_plan_summary(const StepPlan& plan) {
  const Mesh& mesh = plan.options.mesh;
  std::ostringstream out;
  char line[256];
  out << "model " << plan.conventions.name << ", mesh dp " << mesh.dp << " x ring " << mesh.ring << " x ulysses "
      << mesh.ulysses << " (world " << mesh.world() << "), layout " << to_string(plan.options.layout) << ", placement "
      << to_string(plan.options.placement) << "\n";
  out << plan.sequences.size() << " sequences, " << plan.label_count << " label tokens\n";
  for (const RowPlan& row : plan.rows) {
    out << "dp " << row.dp << ": " << row.packing.segments.size() << " segments, " << row.packing.real_tokens
        << " tokens (" << row.packing.length << " padded), " << row.shards.local_length() << " slots per rank, "
        << row.items.size() << " vision items\n";
    std::snprintf(line, sizeof line, "  %6s %5s %8s %10s %16s %14s %14s\n", "rank", "ctx", "tokens", "vis_items",
                  "attn_pairs", "vision_cost", "greedy_cost");
    out << line;
    std::vector<int64_t> count(mesh.context(), 0);
    for (const VisionItem& it : row.items)
      for (int c = 0; c < mesh.context(); ++c) count[c] += it.rows_encoded_by(c) > 0;  // a split item counts on each
    for (int c = 0; c < mesh.context(); ++c) {
      RankCoords rc{row.dp, c / mesh.ulysses, c % mesh.ulysses};
      std::snprintf(line, sizeof line, "  %6d %5d %8lld %10lld %16.0f %14.1f %14.1f\n", global_rank(mesh, rc), c,
                    static_cast<long long>(row.load.tokens[c]), static_cast<long long>(count[c]), row.load.pairs[c],
                    row.load.vision_cost[c], row.load.greedy_vision_cost[c]);
      out << line;
    }
    std::snprintf(line, sizeof line,
                  "  max/mean: tokens %.4f, attention pairs %.4f, vision %.4f (greedy contiguous "
                  "%.4f)%s\n",
                  row.load.tokens_ratio, row.load.pairs_ratio, row.load.vision_ratio, row.load.greedy_vision_ratio,
                  row.used_greedy_fallback ? " [greedy kept: it was better here]" : "");
    out << line;
    if (row.load.split_items > 0)
      out << "  " << row.load.split_items << " vision item(s) split over the context group (vision-tower SP, "
          << to_string(plan.options.vision_split) << ")\n";
    for (const std::string& why : row.vision_kept_whole) out << "  " << why << "\n";
  }
  return out.str();
}

}  // namespace mmsp::plan

namespace mmsp::plan {

std::string placement_comparison(const StepPlan& zigzag, const StepPlan& adaptive) {
  MMSP_ASSERT(zigzag.rows.size() == adaptive.rows.size(), "plans of different meshes");
  const Mesh& mesh = zigzag.options.mesh;
  const AttentionShape& a = zigzag.options.attention_shape;
  std::ostringstream out;
  char line[256];
  out << "placement, zigzag | adaptive (attention bytes per step: H " << a.heads << ", H_kv " << a.kv_heads << ", D "
      << a.head_dim << ", " << a.element_bytes << " bytes, " << a.layers << " layers)\n";
  for (size_t d = 0; d < zigzag.rows.size(); ++d) {
    const LoadReport &z = zigzag.rows[d].load, &x = adaptive.rows[d].load;
    out << "dp " << d << ": zigzag " << z.split_segments << " split | adaptive " << x.whole_segments << " whole, "
        << x.split_segments << " split\n";
    std::snprintf(line, sizeof line, "  %6s %5s | %8s %7s %14s %12s | %8s %7s %14s %12s\n", "rank", "ctx", "tokens",
                  "padding", "attn_pairs", "attn_bytes", "tokens", "padding", "attn_pairs", "attn_bytes");
    out << line;
    for (int c = 0; c < mesh.context(); ++c) {
      const RankCoords rc{static_cast<int>(d), c / mesh.ulysses, c % mesh.ulysses};
      std::snprintf(line, sizeof line, "  %6d %5d | %8lld %7lld %14.0f %12.4g | %8lld %7lld %14.0f %12.4g\n",
                    global_rank(mesh, rc), c, static_cast<long long>(z.tokens[c]), static_cast<long long>(z.padding[c]),
                    z.pairs[c], z.ulysses_bytes[c] + z.ring_bytes[c], static_cast<long long>(x.tokens[c]),
                    static_cast<long long>(x.padding[c]), x.pairs[c], x.ulysses_bytes[c] + x.ring_bytes[c]);
      out << line;
    }
    const double zb = z.attention_bytes_total(), xb = x.attention_bytes_total();
    std::snprintf(line, sizeof line,
                  "  zigzag: padding %lld, tokens max/mean %.4f, pairs max/mean %.4f, bytes %.4g | adaptive: "
                  "padding %lld, tokens %.4f, pairs %.4f, bytes %.4g (%.3f x zigzag)\n",
                  static_cast<long long>(z.padding_total()), z.tokens_ratio, z.pairs_ratio, zb,
                  static_cast<long long>(x.padding_total()), x.tokens_ratio, x.pairs_ratio, xb, zb > 0 ? xb / zb : 1.0);
    out << line;
  }
  return out.str();
}

}  // namespace mmsp::plan
