// Lists of values exchanged through the job's store; see store_agreement.h.
#include "mmsp/dist/store_agreement.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "mmsp/core/check.h"

namespace mmsp::dist {

std::vector<AgreedFlags> exchange_through_store(c10d::Store& store, const std::string& key, int rank, int world_size,
                                                std::chrono::milliseconds timeout, const AgreedFlags& mine) {
  const std::string prefix = "mmsp/agree/" + key + "/";
  const std::string text = encode_flags(mine);
  store.set(prefix + std::to_string(rank), std::vector<uint8_t>(text.begin(), text.end()));
  std::vector<std::string> keys;
  for (int r = 0; r < world_size; ++r) keys.push_back(prefix + std::to_string(r));
  try {
    store.wait(keys, timeout);
  } catch (const std::exception&) {
    throw Error(detail::concat("not every rank posted its ", key, " within ", timeout.count() / 1000.0,
                               " s: a rank died or hung before it"));
  }
  std::vector<AgreedFlags> all(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    const std::vector<uint8_t> value = store.get(keys[static_cast<size_t>(r)]);
    if (!decode_flags(std::string(value.begin(), value.end()), all[static_cast<size_t>(r)]))
      all[static_cast<size_t>(r)] = {{"(unreadable)", ""}};
  }
  return all;
}

}  // namespace mmsp::dist
