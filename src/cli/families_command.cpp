// `mmsp families`; see families_command.h.
#include "families_command.h"

#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "mmsp/model/family.h"

namespace mmsp::cli {

namespace {

// {"model_types": {TYPE: {"family", "image", "video", "start", "end"}}}: the words are the
// processor's text for its vision tokens ("" where the family has none).
nlohmann::ordered_json table_json() {
  nlohmann::ordered_json types = nlohmann::ordered_json::object();
  for (const model::FamilyEntry& e : model::family_table())
    types[e.model_type] = {{"family", e.family},
                           {"image", e.words.image},
                           {"video", e.words.video},
                           {"start", e.words.start},
                           {"end", e.words.end}};
  return {{"generated_by", "mmsp families --json (from src/model/family_registry.cpp)"}, {"model_types", types}};
}

}  // namespace

Subcommand add_families_command(CLI::App& parent) {
  auto json = std::make_shared<bool>(false);
  CLI::App* app = parent.add_subcommand("families", "the model types mmsp trains, by family");
  app->add_flag("--json", *json, "the table python/mmsp/families.json holds");
  return {app, [json]() {
            if (*json) {
              std::cout << table_json().dump(2) << "\n";
              return 0;
            }
            for (const model::FamilyEntry& e : model::family_table())
              std::cout << e.model_type << "\t" << e.family << "\t"
                        << (e.words.video.empty() ? "images" : "images, videos") << "\n";
            return 0;
          }};
}

}  // namespace mmsp::cli
