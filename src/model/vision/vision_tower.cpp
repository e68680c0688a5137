// What every vision tower has unless it says otherwise; see vision_tower.h.
#include "mmsp/model/vision/vision_tower.h"

#include "mmsp/core/check.h"

namespace mmsp::model {

void VisionTower::add_split(const std::vector<plan::VisionItem>& items, const PixelInputs&, const SplitEncoding&,
                            TowerInput&) const {
  MMSP_CHECK(items.empty(), "this family's vision tower encodes every item whole, but the plan splits ", items.size(),
             " item(s) over the context group: plan with --vision-split off");
}

}  // namespace mmsp::model
