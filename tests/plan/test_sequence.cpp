// Vision blocks from input_ids, and every bad-input error naming the sequence and value.
#include "mmsp/plan/sequence.h"

#include "plan_test_util.h"

namespace mmsp::plan {
namespace {

using testing::error_of;
using ::testing::HasSubstr;
using testing::SeqBuilder;

const ModelConventions kQwen2 = testing::released("qwen2_vl");
const ModelConventions kQwen3 = testing::released("qwen3_vl");
const ModelConventions kLlava = testing::released("llava");
const ModelConventions kIntern = testing::released("internvl");

TEST(Sequence, QwenBlocksInOrder) {
  const Sequence s = SeqBuilder(kQwen2).text(3).image({1, 4, 6}).text(2).video({2, 4, 4}).text(1).build();
  const ParsedSequence p = parse_sequence(s, kQwen2, 0);
  ASSERT_EQ(p.blocks.size(), 2u);
  EXPECT_EQ(p.blocks[0].kind, VisionKind::image);
  EXPECT_EQ(p.blocks[0].start, 4);  // 3 text + vision_start
  EXPECT_EQ(p.blocks[0].size(), 6);
  EXPECT_EQ(p.blocks[0].h, 2);
  EXPECT_EQ(p.blocks[0].w, 3);
  EXPECT_EQ(p.blocks[1].kind, VisionKind::video);
  EXPECT_EQ(p.blocks[1].start, 4 + 6 + 1 + 2 + 1);
  EXPECT_EQ(p.blocks[1].size(), 8);
  EXPECT_EQ(p.length, static_cast<int64_t>(s.input_ids.size()));
}

TEST(Sequence, Qwen3VideoFramesAreBlocks) {
  const Sequence s = SeqBuilder(kQwen3).text(2).video({3, 4, 4}).build();
  const ParsedSequence p = parse_sequence(s, kQwen3, 0);
  ASSERT_EQ(p.blocks.size(), 3u);
  for (int f = 0; f < 3; ++f) {
    EXPECT_EQ(p.blocks[f].item, 0);
    EXPECT_EQ(p.blocks[f].first_frame, f);
    EXPECT_EQ(p.blocks[f].first_row, 4 * f);
    EXPECT_EQ(p.blocks[f].size(), 4);
  }
  // 2 text, then per frame 3 timestamp tokens + start + 4 pads + end
  EXPECT_EQ(p.blocks[1].start, 2 + 9 + 3 + 1);
}

TEST(Sequence, Qwen3TransformersWrapperIsText) {
  // transformers 5.x leaves the template's markers around a video's frame blocks: the same
  // blocks, one token later; the wrapper's two markers are text.
  const Sequence flat = SeqBuilder(kQwen3).text(2).video({3, 4, 4}).text(1).image({1, 4, 4}).build();
  const Sequence wrapped = SeqBuilder(kQwen3).text(2).wrapped_video({3, 4, 4}).text(1).image({1, 4, 4}).build();
  ASSERT_EQ(wrapped.input_ids.size(), flat.input_ids.size() + 2);
  const ParsedSequence a = parse_sequence(flat, kQwen3, 0), b = parse_sequence(wrapped, kQwen3, 0);
  ASSERT_EQ(b.blocks.size(), a.blocks.size());
  for (size_t k = 0; k < a.blocks.size(); ++k) {
    EXPECT_EQ(b.blocks[k].start, a.blocks[k].start + (a.blocks[k].kind == VisionKind::video ? 1 : 2));
    EXPECT_EQ(b.blocks[k].first_frame, a.blocks[k].first_frame);
    EXPECT_EQ(b.blocks[k].item, a.blocks[k].item);
  }
  // Two wrapped videos in a row, and a bare one after them.
  const Sequence two = SeqBuilder(kQwen3).wrapped_video({2, 4, 4}).wrapped_video({1, 2, 2}).video({2, 2, 2}).build();
  EXPECT_EQ(parse_sequence(two, kQwen3, 0).blocks.size(), 5u);
  // mmsp.patch hands a video's temporal patches over as videos of t = 1 (get_rope_index
  // splits them so): one wrapper then holds several.
  Sequence split = SeqBuilder(kQwen3).wrapped_video({2, 4, 4}).build();
  split.video_grid_thw = {{1, 4, 4}, {1, 4, 4}};
  EXPECT_EQ(parse_sequence(split, kQwen3, 0).blocks.size(), 2u);
}

TEST(Sequence, LlavaSplitsAdjacentImagesByGrid) {
  const Sequence s = SeqBuilder(kLlava).text(2).image({1, 2, 3}).image({1, 2, 2}).text(1).build();
  const ParsedSequence p = parse_sequence(s, kLlava, 0);
  ASSERT_EQ(p.blocks.size(), 2u);
  EXPECT_EQ(p.blocks[0].start, 2);
  EXPECT_EQ(p.blocks[0].size(), 6);
  EXPECT_EQ(p.blocks[1].start, 8);
  EXPECT_EQ(p.blocks[1].size(), 4);
}

// vision_feature_select_strategy "full": transformers' processor writes 1 + patches
// <image> tokens per image (the class token's row first).
TEST(Sequence, LlavaFullKeepsTheClassTokenRow) {
  ModelConventions full = kLlava;
  full.class_rows = 1;
  const Sequence s = SeqBuilder(full).text(2).image({1, 2, 3}).image({1, 2, 2}).text(1).build();
  ASSERT_EQ(s.input_ids.size(), 2u + 7 + 5 + 1);
  const ParsedSequence p = parse_sequence(s, full, 0);
  ASSERT_EQ(p.blocks.size(), 2u);
  EXPECT_EQ(p.blocks[0].size(), 7);
  EXPECT_EQ(p.blocks[1].start, 9);
  EXPECT_EQ(p.blocks[1].size(), 5);
  // the "default" count (patches only) is refused, naming the rule
  const Sequence short_run = SeqBuilder(kLlava).text(1).image({1, 2, 2}).text(1).build();
  EXPECT_THAT(error_of([&] { parse_sequence(short_run, full, 3); }),
              HasSubstr("sequence 3: image 0 has 4 placeholder tokens but grid [1, 2, 2] with spatial_merge_size 1 "
                        "needs 5"));
  const Sequence two = SeqBuilder(kLlava).text(1).image({1, 2, 2}).image({1, 2, 2}).text(1).build();
  EXPECT_THAT(error_of([&] { parse_sequence(two, full, 3); }),
              HasSubstr("image 1 has 3 placeholder tokens but grid [1, 2, 2] with spatial_merge_size 1 needs 5 "
                        "(its patches + 1 class token: vision_feature_select_strategy \"full\")"));
}

TEST(Sequence, InternVLBlocks) {
  const Sequence s = SeqBuilder(kIntern).text(1).image({2, 4, 4}).build();  // 2 tiles
  const ParsedSequence p = parse_sequence(s, kIntern, 0);
  ASSERT_EQ(p.blocks.size(), 1u);
  EXPECT_EQ(p.blocks[0].size(), 8);
  EXPECT_EQ(s.input_ids[1], 151665);
  EXPECT_EQ(s.input_ids.back(), 151666);
}

TEST(SequenceErrors, PlaceholderCountMismatch) {
  Sequence s = SeqBuilder(kQwen2).text(2).image({1, 4, 4}).image({1, 16, 16}).build();
  // drop one placeholder of image 1
  auto it = std::find(s.input_ids.rbegin(), s.input_ids.rend(), kQwen2.image_token_id);
  s.input_ids.erase(std::next(it).base());
  EXPECT_EQ(error_of([&] { parse_sequence(s, kQwen2, 2); }),
            "sequence 2: image 1 has 63 placeholder tokens but grid [1, 16, 16] with "
            "spatial_merge_size 2 needs 64");
}

TEST(SequenceErrors, GridNotDivisible) {
  Sequence s = SeqBuilder(kQwen2).text(2).image({1, 4, 4}).build();
  s.image_grid_thw[0] = {1, 5, 4};
  EXPECT_THAT(error_of([&] { parse_sequence(s, kQwen2, 1); }),
              HasSubstr("sequence 1: image 0 grid [1, 5, 4] is not divisible by spatial_merge_size 2"));
  s.image_grid_thw[0] = {0, 4, 4};
  EXPECT_THAT(error_of([&] { parse_sequence(s, kQwen2, 1); }),
              HasSubstr("sequence 1: image 0 grid [0, 4, 4] must have t, h, w >= 1"));
}

TEST(SequenceErrors, UnmatchedStartEnd) {
  Sequence s = SeqBuilder(kQwen2).text(2).image({1, 2, 2}).text(2).build();
  Sequence no_end = s;
  no_end.input_ids[2 + 1 + 1] = 500;  // the end token becomes text
  EXPECT_THAT(error_of([&] { parse_sequence(no_end, kQwen2, 3); }),
              HasSubstr("sequence 3: vision block opened at index 2 is not closed by end token 151653"));
  Sequence stray_end = s;
  stray_end.input_ids[0] = kQwen2.vision_end_token_id;
  EXPECT_THAT(error_of([&] { parse_sequence(stray_end, kQwen2, 0); }),
              HasSubstr("sequence 0: vision end token 151653 at index 0 has no matching start token 151652"));
  Sequence stray_pad = s;
  stray_pad.input_ids[0] = kQwen2.image_token_id;
  EXPECT_THAT(error_of([&] { parse_sequence(stray_pad, kQwen2, 0); }),
              HasSubstr("sequence 0: placeholder token 151655 at index 0 is outside a vision block"));
  Sequence last = SeqBuilder(kQwen2).text(2).build();
  last.input_ids.push_back(kQwen2.vision_start_token_id);
  EXPECT_THAT(error_of([&] { parse_sequence(last, kQwen2, 4); }),
              HasSubstr("sequence 4: vision start token 151652 at index 2 is the last token"));
  Sequence bad_follow = SeqBuilder(kQwen2).text(2).build();
  bad_follow.input_ids.insert(bad_follow.input_ids.begin(), kQwen2.vision_start_token_id);
  EXPECT_THAT(error_of([&] { parse_sequence(bad_follow, kQwen2, 0); }), HasSubstr("is followed by token"));
}

TEST(SequenceErrors, StrayTokenFoundAtEveryOffset) {
  // The scan steps 8 tokens at a time: a stray marker at any offset must still be found.
  for (int64_t pos = 0; pos < 41; ++pos) {
    for (int64_t tok : {kQwen2.image_token_id, kQwen2.video_token_id, kQwen2.vision_end_token_id}) {
      Sequence s = SeqBuilder(kQwen2, static_cast<uint32_t>(pos)).text(41).build();
      s.input_ids[pos] = tok;
      EXPECT_THAT(error_of([&] { parse_sequence(s, kQwen2, 0); }), HasSubstr(detail::concat(" at index ", pos, " ")))
          << "token " << tok << " at " << pos;
    }
  }
}

TEST(SequenceErrors, MoreOrFewerGridsThanBlocks) {
  Sequence s = SeqBuilder(kQwen2).text(2).image({1, 2, 2}).build();
  Sequence extra_grid = s;
  extra_grid.image_grid_thw.push_back({1, 2, 2});
  EXPECT_THAT(error_of([&] { parse_sequence(extra_grid, kQwen2, 5); }),
              HasSubstr("sequence 5: image_grid_thw has 2 entries but the sequence has placeholders for 1 images"));
  Sequence few_grids = s;
  few_grids.image_grid_thw.clear();
  EXPECT_THAT(error_of([&] { parse_sequence(few_grids, kQwen2, 5); }),
              HasSubstr("sequence 5: image placeholder tokens at index 3 belong to image 0 but "
                        "image_grid_thw has only 0 entries"));
  Sequence v = SeqBuilder(kQwen2).video({2, 2, 2}).build();
  v.video_grid_thw.push_back({1, 2, 2});
  EXPECT_THAT(error_of([&] { parse_sequence(v, kQwen2, 0); }),
              HasSubstr("video_grid_thw has 2 entries but the sequence has placeholders for 1 videos"));
}

TEST(SequenceErrors, Qwen3FrameCounts) {
  Sequence s = SeqBuilder(kQwen3).video({3, 4, 4}).build();
  Sequence missing_frame = s;
  missing_frame.video_grid_thw[0] = {4, 4, 4};
  EXPECT_THAT(error_of([&] { parse_sequence(missing_frame, kQwen3, 1); }),
              HasSubstr("sequence 1: video 0 grid [4, 4, 4] has 4 frames but the sequence has blocks for 3"));
  Sequence wrong = s;
  wrong.video_grid_thw[0] = {3, 4, 8};
  EXPECT_THAT(error_of([&] { parse_sequence(wrong, kQwen3, 1); }),
              HasSubstr("sequence 1: video 0 frame 0 has 4 placeholder tokens but grid [3, 4, 8] "
                        "with spatial_merge_size 2 needs 8 per frame"));
}

TEST(SequenceErrors, Qwen3WrapperHoldsOneWholeVideo) {
  const int64_t start = kQwen3.vision_start_token_id, end = kQwen3.vision_end_token_id;
  // Not closed.
  Sequence open = SeqBuilder(kQwen3).text(2).wrapped_video({2, 4, 4}).build();
  open.input_ids.back() = 500;
  EXPECT_THAT(error_of([&] { parse_sequence(open, kQwen3, 2); }),
              HasSubstr("sequence 2: the video wrapper opened by vision start token 151652 at index 2 is not "
                        "closed by end token 151653"));
  // Empty.
  Sequence empty = SeqBuilder(kQwen3).text(2).build();
  empty.input_ids.insert(empty.input_ids.end(), {start, 500, 501, end});
  EXPECT_THAT(error_of([&] { parse_sequence(empty, kQwen3, 0); }),
              HasSubstr("sequence 0: the video wrapper opened at index 2 and closed at index 5 holds no video "
                        "frame block"));
  // Closed after 1 of 2 frames.
  Sequence half = SeqBuilder(kQwen3).wrapped_video({2, 4, 4}).build();
  const int64_t per_frame = 3 + 1 + 4 + 1;
  half.input_ids.insert(half.input_ids.begin() + 1 + per_frame, end);
  half.input_ids.pop_back();
  EXPECT_THAT(error_of([&] { parse_sequence(half, kQwen3, 0); }),
              HasSubstr("closes at index 10 after 1 frames of video 0 (grid [2, 4, 4])"));
  // An image inside.
  Sequence image = SeqBuilder(kQwen3).text(1).build();
  image.input_ids.push_back(start);
  const Sequence img = SeqBuilder(kQwen3).image({1, 2, 2}).build();
  image.input_ids.insert(image.input_ids.end(), img.input_ids.begin(), img.input_ids.end());
  image.input_ids.push_back(end);
  image.image_grid_thw = img.image_grid_thw;
  EXPECT_THAT(error_of([&] { parse_sequence(image, kQwen3, 0); }),
              HasSubstr("an image block at index 2 is inside the video wrapper opened at index 1"));
  // Nested wrappers.
  Sequence nested = SeqBuilder(kQwen3).wrapped_video({1, 4, 4}).build();
  nested.input_ids.insert(nested.input_ids.begin(), {start, 500});
  nested.input_ids.push_back(end);
  EXPECT_THAT(error_of([&] { parse_sequence(nested, kQwen3, 0); }),
              HasSubstr("inside the video wrapper opened at index 0; a wrapper holds whole videos' timestamped frame "
                        "blocks and does not nest"));
  // Qwen2-VL writes no wrapper: a start marker before text is still an error there.
  Sequence q2 = SeqBuilder(kQwen2).text(2).build();
  q2.input_ids.insert(q2.input_ids.begin(), start);
  EXPECT_THAT(error_of([&] { parse_sequence(q2, kQwen2, 0); }),
              HasSubstr("sequence 0: vision start token 151652 at index 0 is followed by token"));
}

TEST(SequenceErrors, LlavaRuns) {
  Sequence s = SeqBuilder(kLlava).text(1).image({1, 2, 2}).text(1).build();
  Sequence more = s;
  more.input_ids.insert(more.input_ids.begin() + 1, kLlava.image_token_id);
  EXPECT_THAT(error_of([&] { parse_sequence(more, kLlava, 2); }),
              HasSubstr("sequence 2: 1 image placeholder tokens from index 5 are left over after the 1 images"));
  Sequence fewer = s;
  fewer.input_ids.erase(fewer.input_ids.begin() + 1);
  EXPECT_THAT(error_of([&] { parse_sequence(fewer, kLlava, 2); }),
              HasSubstr("sequence 2: image 0 has 3 placeholder tokens but grid [1, 2, 2] with "
                        "spatial_merge_size 1 needs 4"));
  Sequence video = s;
  video.video_grid_thw.push_back({1, 2, 2});
  EXPECT_THAT(error_of([&] { parse_sequence(video, kLlava, 0); }),
              HasSubstr("model llava has no video placeholder token"));
}

TEST(SequenceErrors, Int32AndFields) {
  Sequence s = SeqBuilder(kQwen2).text(2).image({1, 2, 2}).build();
  s.image_grid_thw[0] = {2, 65536, 65536};
  EXPECT_THAT(error_of([&] { parse_sequence(s, kQwen2, 0); }),
              HasSubstr("sequence 0: image 0 grid [2, 65536, 65536] has 8.58993e+09 patches"));
  Sequence empty;
  EXPECT_THAT(error_of([&] { parse_sequence(empty, kQwen2, 7); }), HasSubstr("sequence 7: input_ids is empty"));
  Sequence mask = SeqBuilder(kQwen2).text(4).build();
  mask.loss_mask = {1, 1};
  EXPECT_THAT(error_of([&] { parse_sequence(mask, kQwen2, 1); }),
              HasSubstr("sequence 1: loss_mask has 2 entries but input_ids has 4"));
  mask.loss_mask = {1, 1, 2, 1};
  EXPECT_THAT(error_of([&] { parse_sequence(mask, kQwen2, 1); }),
              HasSubstr("sequence 1: loss_mask[2] is 2, expected 0 or 1"));
  Sequence secs = SeqBuilder(kQwen2).video({2, 2, 2}, 0.5).build();
  EXPECT_THAT(error_of([&] { parse_sequence(secs, kQwen2, 0); }),
              HasSubstr("second_per_grid_ts is only used by qwen2_5_vl"));
  const ModelConventions q25 = testing::released("qwen2_5_vl");
  Sequence secs25 = SeqBuilder(q25).video({2, 2, 2}, 0.5).video({2, 2, 2}).build();
  EXPECT_THAT(error_of([&] { parse_sequence(secs25, q25, 3); }),
              HasSubstr("sequence 3: second_per_grid_ts has 1 entries but video_grid_thw has 2"));
}

}  // namespace
}  // namespace mmsp::plan
