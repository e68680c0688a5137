// The flags every rank of a job must share (the resolved options that change the
// numerics or the collectives' schedule: dtype, learning rate, mesh, sharding, ...),
// compared once at the rendezvous, before any process group exists. A wrapper that
// adds a flag on one rank would otherwise train replicas that silently diverge, or
// send collectives of other sizes until the timeout.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace mmsp::dist {

// (flag, resolved value) in a fixed order, e.g. {"--lr", "0.001"}.
using AgreedFlags = std::vector<std::pair<std::string, std::string>>;

// Length-prefixed ("3:--lr5:0.001"), exact for any bytes; decode gives false on
// anything malformed.
std::string encode_flags(const AgreedFlags& flags);
bool decode_flags(const std::string& text, AgreedFlags& out);

// "rank 3" or "ranks 0, 2, 3": the start-up's messages name ranks this way.
std::string rank_list(const std::vector<int>& ranks);

// Words a group of ranks: rank_list, or with their hosts (JobHosts::name_ranks).
using RankNamer = std::function<std::string(const std::vector<int>&)>;

// The differences alone, the same text on every rank: "--lr is 0.001 on ranks 0, 2, 3 and
// 0.01 on rank 1; ..." ("" when every list is equal), or the ranks whose list is shaped
// otherwise (another mmsp build). Agreements other than the start-up's flags (what each
// rank loaded) give it their own words.
std::string value_disagreement(const std::vector<AgreedFlags>& per_rank, const RankNamer& name_ranks = {});

// "" when every rank's flags are equal; otherwise "the ranks were started with different
// flags: " + value_disagreement + what to do.
std::string flag_disagreement(const std::vector<AgreedFlags>& per_rank, const RankNamer& name_ranks = {});

// A value for AgreedFlags: the shortest text that reads back as the same double.
std::string exact_number(double value);

}  // namespace mmsp::dist
