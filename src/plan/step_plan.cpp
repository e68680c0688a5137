// make_step_plan: parse and validate the batch, pack one row per dp rank, shard it,
// assign vision items, report loads, and build the asking rank's slots and routes.
#include "mmsp/plan/step_plan.h"

#include <algorithm>
#include <limits>

#include "mmsp/core/check.h"

namespace mmsp::plan {

namespace {

// Where each sequence's first image / video sits among the batch's items and pixel rows.
struct KindOffsets {
  std::vector<int64_t> first_image, first_video, image_patches, video_patches;
};

KindOffsets kind_offsets(const Batch& batch) {
  KindOffsets o;
  int64_t images = 0, videos = 0, ip = 0, vp = 0;
  for (const Sequence& s : batch.sequences) {
    o.first_image.push_back(images);
    o.first_video.push_back(videos);
    o.image_patches.push_back(ip);
    o.video_patches.push_back(vp);
    images += static_cast<int64_t>(s.image_grid_thw.size());
    videos += static_cast<int64_t>(s.video_grid_thw.size());
    for (const Grid& g : s.image_grid_thw) ip += g[0] * g[1] * g[2];
    for (const Grid& g : s.video_grid_thw) vp += g[0] * g[1] * g[2];
  }
  return o;
}

std::vector<VisionItem> collect_items(const Batch& batch, const StepPlan& plan, const PackedRow& packing,
                                      const KindOffsets& offsets) {
  std::vector<VisionItem> items;
  for (const Segment& seg : packing.segments) {
    const Sequence& seq = batch.sequences[seg.sequence];
    std::vector<int64_t> image_item(seq.image_grid_thw.size(), -1);
    std::vector<int64_t> video_item(seq.video_grid_thw.size(), -1);
    std::vector<int64_t> image_patch(seq.image_grid_thw.size() + 1, 0);
    std::vector<int64_t> video_patch(seq.video_grid_thw.size() + 1, 0);
    for (size_t k = 0; k < seq.image_grid_thw.size(); ++k) {
      const Grid& g = seq.image_grid_thw[k];
      image_patch[k + 1] = image_patch[k] + g[0] * g[1] * g[2];
    }
    for (size_t k = 0; k < seq.video_grid_thw.size(); ++k) {
      const Grid& g = seq.video_grid_thw[k];
      video_patch[k + 1] = video_patch[k] + g[0] * g[1] * g[2];
    }
    for (const VisionBlock& b : plan.sequences[seg.sequence].blocks) {
      const bool image = b.kind == VisionKind::image;
      int64_t& slot = image ? image_item[b.item] : video_item[b.item];
      if (slot < 0) {
        slot = static_cast<int64_t>(items.size());
        VisionItem it;
        it.sequence = seg.sequence;
        it.kind = b.kind;
        it.index = b.item;
        it.grid = image ? seq.image_grid_thw[b.item] : seq.video_grid_thw[b.item];
        it.batch_index = (image ? offsets.first_image : offsets.first_video)[seg.sequence] + b.item;
        it.rows = vision_row_count(it.grid, plan.conventions);
        it.patches = it.grid[0] * it.grid[1] * it.grid[2];
        it.patch_offset = (image ? offsets.image_patches : offsets.video_patches)[seg.sequence] +
                          (image ? image_patch : video_patch)[b.item];
        it.cost = encoder_cost(it.grid, plan.options.vision_cost);
        items.push_back(std::move(it));
      }
      items[slot].pieces.push_back({seg.start + b.start, b.size(), b.first_row});
    }
  }
  return items;
}

LoadReport load_report(const RowPlan& row, int S, const AttentionShape& shape) {
  LoadReport r;
  const int U = row.shards.ulysses(), R = row.shards.ring();
  const int64_t L = row.shards.local_length();
  r.tokens.assign(S, 0);
  r.pairs.assign(S, 0.0);
  std::vector<double> ring_pairs(S / U, 0.0);
  for (int c = 0; c < S; ++c) {
    for (const SlotRun& run : row.shards.runs(c)) {
      if (run.segment < 0) continue;
      const Segment& seg = row.packing.segments[run.segment];
      const int64_t real = std::clamp<int64_t>(seg.length - run.index, 0, run.length);
      r.tokens[c] += real;
      // A query at index i of its segment attends keys 0..i: i + 1 pairs.
      const double pairs = causal_pairs(run.index, run.index + real);
      if (seg.home >= 0)
        r.pairs[c] += pairs;
      else
        ring_pairs[c / U] += pairs;
    }
  }
  // Ulysses gives each of its U ranks all of the ring rank's split tokens for 1/U of the heads.
  for (int c = 0; c < S; ++c) r.pairs[c] += ring_pairs[c / U] / U;
  for (const Segment& seg : row.packing.segments) ++(seg.home >= 0 ? r.whole_segments : r.split_segments);
  // With a segment held whole only the split slots are exchanged (attention/step_attention.h),
  // otherwise every slot, padding included, as zigzag always has.
  const bool all = r.whole_segments == 0;
  int64_t share = 0;  // the split tokens of one ring rank
  for (int c = 0; c < U; ++c) share += row.shards.split_slots(c);
  for (int c = 0; c < S; ++c) {
    r.padding.push_back(L - r.tokens[c]);
    std::vector<int64_t> exchanged(U, L);
    if (!all)
      for (int u = 0; u < U; ++u) exchanged[u] = row.shards.split_slots(c / U * U + u);
    r.ulysses_bytes.push_back(ulysses_bytes(shape, exchanged, c % U));
    r.ring_bytes.push_back(ring_bytes(shape, R, U, all ? L * U : share));
  }
  std::vector<double> costs(row.items.size());
  r.vision_cost.assign(S, 0.0);
  for (size_t i = 0; i < row.items.size(); ++i) {
    const VisionItem& it = row.items[i];
    costs[i] = it.cost;
    r.split_items += it.split();
    // A split item's cost falls on the ranks by their rows (Ulysses: all of its patches,
    // 1/S of the heads, on each).
    if (it.rows > 0)
      for (int c = 0; c < S; ++c) r.vision_cost[c] += it.cost * double(it.rows_encoded_by(c)) / double(it.rows);
  }
  r.greedy_vision_cost = evaluate_assignment(row.greedy_rank, costs, S).load;
  auto ratio = [](const std::vector<int64_t>& v) { return max_over_mean(std::vector<double>(v.begin(), v.end())); };
  r.tokens_ratio = ratio(r.tokens);
  r.pairs_ratio = max_over_mean(r.pairs);
  r.vision_ratio = max_over_mean(r.vision_cost);
  r.greedy_vision_ratio = max_over_mean(r.greedy_vision_cost);
  return r;
}

// Vision-tower SP first (the items the options split, vision_split.h), then Vision DP over
// the items left whole. A rank's encoder output holds its whole items' rows, then its
// shard of each split item.
void plan_vision(RowPlan& row, int S, const PlanOptions& options, const ModelConventions& conventions) {
  const VisionCostModel& model = options.vision_cost;
  const std::vector<bool> split =
      choose_split_items(row.items, S, conventions, options.vision_split, &row.vision_kept_whole);
  std::vector<size_t> whole;
  for (size_t i = 0; i < row.items.size(); ++i)
    if (!split[i]) whole.push_back(i);
  const size_t n = whole.size();
  std::vector<double> costs(n);
  std::vector<int64_t> patches(n), all_patches;
  std::vector<int> preferred(n);
  std::vector<HeldRows> held(n);
  for (size_t k = 0; k < n; ++k) {
    VisionItem& it = row.items[whole[k]];
    held[k] = held_rows(it, row.shards);
    it.preferred_rank = holder_rank(held[k]);
    costs[k] = it.cost;
    patches[k] = it.patches;
    preferred[k] = it.preferred_rank;
  }
  VisionAssignment a = assign_vision_balanced(costs, patches, preferred, S, model);
  keep_rows_home(a, costs, held, S, model);
  check_encoder_patches(patches, a.rank_of_item, S, row.dp);
  row.used_greedy_fallback = a.used_greedy_fallback;
  for (const VisionItem& it : row.items) all_patches.push_back(it.patches);
  row.greedy_rank = assign_greedy_contiguous(all_patches, S);  // every item whole, for comparison
  std::vector<int64_t> encoder_rows(S, 0);
  for (size_t k = 0; k < n; ++k) {
    VisionItem& it = row.items[whole[k]];
    it.encoder_rank = a.rank_of_item[k];
    it.encoder_row = encoder_rows[it.encoder_rank];
    encoder_rows[it.encoder_rank] += it.rows;
  }
  int64_t split_patches = 0;  // every split item's patches meet in one attention call per rank
  for (size_t i = 0; i < row.items.size(); ++i) {
    if (!split[i]) continue;
    VisionItem& it = row.items[i];
    it.preferred_rank = holder_rank(held_rows(it, row.shards));
    it.encoder_rank = -1;
    it.encoder_row = 0;
    it.shard_rows = split_item_rows(it, S, conventions);
    it.shard_encoder_row.resize(S);
    for (int r = 0; r < S; ++r) {
      it.shard_encoder_row[r] = encoder_rows[r];
      encoder_rows[r] += it.shard_rows[r + 1] - it.shard_rows[r];
    }
    split_patches += it.patches;
  }
  MMSP_CHECK(split_patches <= std::numeric_limits<int32_t>::max(), "dp row ", row.dp, ": the split items' ",
             split_patches, " patches meet in one vision attention call whose cu_seqlens are int32 (at most ",
             std::numeric_limits<int32_t>::max(), "): split fewer items per step");
}

}  // namespace

int64_t LoadReport::padding_total() const {
  int64_t total = 0;
  for (int64_t p : padding) total += p;
  return total;
}

double LoadReport::attention_bytes_total() const {
  double total = 0.0;
  for (size_t c = 0; c < ulysses_bytes.size(); ++c) total += ulysses_bytes[c] + ring_bytes[c];
  return total;
}

StepPlan make_step_plan(const Batch& batch, const ModelConventions& conventions, const PlanOptions& options, int rank) {
  validate_mesh(options.mesh);
  rank_coords(options.mesh, rank);  // checks the rank
  MMSP_CHECK(!batch.sequences.empty(), "batch is empty: it needs at least one sequence");
  MMSP_CHECK(conventions.spatial_merge_size >= 1, "spatial_merge_size must be >= 1, got ",
             conventions.spatial_merge_size);
  StepPlan plan;
  plan.options = options;
  plan.conventions = conventions;
  const int64_t n = static_cast<int64_t>(batch.sequences.size());
  plan.sequences.reserve(n);
  plan.positions.reserve(n);
  std::vector<int64_t> lengths(n);
  for (int64_t i = 0; i < n; ++i) {
    const Sequence& seq = batch.sequences[i];
    plan.sequences.push_back(parse_sequence(seq, conventions, i));
    plan.positions.push_back(make_sequence_positions(plan.sequences.back(), seq, conventions));
    plan.rope_deltas.push_back(plan.positions.back().rope_delta());
    plan.label_count += count_labels(seq, plan.sequences.back(), conventions);
    lengths[i] = plan.sequences.back().length;
  }

  const Mesh& mesh = options.mesh;
  const int S = mesh.context();
  MMSP_CHECK(options.placement == Placement::zigzag || options.layout == Layout::zigzag,
             "placement adaptive splits long segments in zigzag order; it needs layout zigzag, not ",
             to_string(options.layout));
  const auto groups = assign_sequences_to_dp(lengths, mesh.dp);
  plan.dp_of_sequence.assign(n, 0);
  const KindOffsets offsets = kind_offsets(batch);
  plan.rows.resize(mesh.dp);
  for (int d = 0; d < mesh.dp; ++d) {
    RowPlan& row = plan.rows[d];
    row.dp = d;
    std::vector<int64_t> group_lengths;
    for (int64_t s : groups[d]) {
      plan.dp_of_sequence[s] = d;
      group_lengths.push_back(lengths[s]);
    }
    // Which segments stay whole depends on lengths alone, so it precedes the packing.
    const std::vector<int> home =
        place_segments(group_lengths, mesh.ring, mesh.ulysses, options.placement, options.placement_balance);
    row.packing = pack_row(groups[d], group_lengths, mesh.ring, home);
    row.shards = ShardMap(row.packing, mesh.ring, mesh.ulysses, options.layout);
    MMSP_CHECK(row.shards.local_length() <= std::numeric_limits<int32_t>::max(), "dp rank ", d, ": ",
               row.shards.local_length(), " slots per rank is beyond int32");
    row.items = collect_items(batch, plan, row.packing, offsets);
    plan_vision(row, S, options, conventions);
    row.pieces = flatten_pieces(row.items);
    row.load = load_report(row, S, options.attention_shape);
  }
  plan.mine = make_rank_plan(batch, plan, rank);
  return plan;
}

RankPlan make_rank_plan(const Batch& batch, const StepPlan& plan, int rank) {
  MMSP_ASSERT(batch.sequences.size() == plan.sequences.size(), "plan of another batch");
  const Mesh& mesh = plan.options.mesh;
  RankPlan rp;
  rp.rank = rank;
  rp.coords = rank_coords(mesh, rank);
  const RowPlan& row = plan.rows[rp.coords.dp];
  const int c = rp.coords.context_rank(mesh);
  const int64_t L = row.shards.local_length();
  rp.local_length = L;
  rp.position_rows = plan.conventions.uses_mrope() ? 3 : 1;
  rp.tokens.assign(L, -1);
  rp.segment_ids.assign(L, -1);
  rp.segment_index.assign(L, -1);
  rp.positions.assign(rp.position_rows * L, kPadPosition);
  rp.labels.assign(L, kIgnoreIndex);
  int64_t* rows[3] = {nullptr, nullptr, nullptr};
  for (const SlotRun& run : row.shards.runs(c)) {
    if (run.segment < 0) continue;
    const Segment& seg = row.packing.segments[run.segment];
    const int64_t real = std::clamp<int64_t>(seg.length - run.index, 0, run.length);
    for (int64_t k = 0; k < run.length; ++k) {
      rp.segment_ids[run.slot + k] = run.segment;
      rp.segment_index[run.slot + k] = run.index + k;
    }
    for (int64_t k = 0; k < real; ++k) rp.tokens[run.slot + k] = run.packed + k;
    if (real == 0) continue;
    for (int r = 0; r < rp.position_rows; ++r) rows[r] = rp.positions.data() + r * L + run.slot;
    plan.positions[seg.sequence].fill(run.index, real, rows);
    fill_labels(batch.sequences[seg.sequence], plan.conventions, run.index, real, rp.labels.data() + run.slot);
  }
  rp.routes = make_rank_routes(row.items, row.pieces, row.shards, c);
  return rp;
}

std::vector<int64_t> row_position_ids(const StepPlan& plan, int dp) {
  MMSP_CHECK(dp >= 0 && dp < static_cast<int>(plan.rows.size()), "dp rank ", dp, " is outside the ", plan.rows.size(),
             " rows");
  const PackedRow& packing = plan.rows[dp].packing;
  const int nrows = plan.conventions.uses_mrope() ? 3 : 1;
  const int64_t L = packing.length;
  std::vector<int64_t> out(nrows * L, kPadPosition);
  int64_t* rows[3] = {nullptr, nullptr, nullptr};
  for (const Segment& seg : packing.segments) {
    for (int r = 0; r < nrows; ++r) rows[r] = out.data() + r * L + seg.start;
    plan.positions[seg.sequence].fill(0, seg.length, rows);
  }
  return out;
}

}  // namespace mmsp::plan
