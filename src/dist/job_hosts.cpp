// Each rank's host and listening address, chosen the same way on every rank; see job_hosts.h.
#include "mmsp/dist/job_hosts.h"

#include <algorithm>

#include "mmsp/core/check.h"
#include "mmsp/dist/flag_agreement.h"

namespace mmsp::dist {
namespace {

using detail::concat;

std::string encode_address(const InterfaceAddress& a) {
  return encode_flags({{"interface", a.interface},
                       {"address", a.address},
                       {"prefix", std::to_string(a.prefix_length)},
                       {"loopback", a.loopback ? "1" : "0"}});
}

bool decode_address(const std::string& text, InterfaceAddress& out) {
  AgreedFlags fields;
  if (!decode_flags(text, fields) || fields.size() != 4 || fields[0].first != "interface" ||
      fields[1].first != "address" || fields[2].first != "prefix" || fields[3].first != "loopback")
    return false;
  out.interface = fields[0].second;
  out.address = fields[1].second;
  const std::string& prefix = fields[2].second;
  if (prefix.empty() || prefix.size() > 3 || prefix.find_first_not_of("0123456789") != std::string::npos) return false;
  out.prefix_length = std::stoi(prefix);
  out.loopback = fields[3].second == "1";
  return true;
}

// fe80::/10 needs a scope to be bound or reached: never a listening address across hosts.
bool link_local_v6(const std::string& address) {
  return address.size() > 4 && (address.compare(0, 4, "fe80") == 0 || address.compare(0, 4, "FE80") == 0);
}

std::string where(const InterfaceAddress& a) {
  return a.interface.empty() ? a.address : a.address + " on " + a.interface;
}

}  // namespace

RankHost describe_this_rank(const std::string& master_addr, int master_port, const std::string& gloo_interface) {
  RankHost host;
  const HostIdentity id = this_host();
  host.key = id.key;
  host.hostname = id.hostname;
  if (!gloo_interface.empty()) {
    host.route = address_of_interface(gloo_interface);
    host.interface_from_env = true;
  } else {
    host.route = local_address_towards(master_addr, master_port);
  }
  for (const auto& a : host_interfaces())
    if (!a.loopback && !link_local_v6(a.address)) host.interfaces.push_back(a);
  return host;
}

std::string encode_rank_host(const RankHost& host) {
  AgreedFlags fields = {{"key", host.key},
                        {"hostname", host.hostname},
                        {"route", encode_address(host.route)},
                        {"from_env", host.interface_from_env ? "1" : "0"},
                        {"interfaces", std::to_string(host.interfaces.size())}};  // a cut record never reads
  for (const auto& a : host.interfaces) fields.emplace_back("interface", encode_address(a));
  return encode_flags(fields);
}

bool decode_rank_host(const std::string& text, RankHost& out) {
  AgreedFlags fields;
  if (!decode_flags(text, fields) || fields.size() < 5 || fields[0].first != "key" || fields[1].first != "hostname" ||
      fields[2].first != "route" || fields[3].first != "from_env" || fields[4].first != "interfaces" ||
      fields[4].second != std::to_string(fields.size() - 5))
    return false;
  out = RankHost{};
  out.key = fields[0].second;
  out.hostname = fields[1].second;
  if (!decode_address(fields[2].second, out.route)) return false;
  out.interface_from_env = fields[3].second == "1";
  for (size_t i = 5; i < fields.size(); ++i) {
    InterfaceAddress a;
    if (fields[i].first != "interface" || !decode_address(fields[i].second, a)) return false;
    out.interfaces.push_back(a);
  }
  return true;
}

JobHosts::JobHosts(std::vector<RankHost> ranks) : ranks_(std::move(ranks)) {
  std::vector<std::string> keys;
  for (const auto& r : ranks_) {
    auto it = std::find(keys.begin(), keys.end(), r.key);
    host_of_.push_back(static_cast<int>(it - keys.begin()));
    if (it == keys.end()) keys.push_back(r.key);
  }
  hosts_ = static_cast<int>(keys.size());
  for (const auto& r : ranks_) listen_.push_back(r.route);
  if (!spans_hosts()) return;  // one host: loopback reaches every peer

  // Ranks that are on one host but would listen on loopback: the others cannot connect.
  const auto on_hosts = [&] {
    std::string out;
    for (int h = 0; h < hosts_; ++h) {
      std::vector<int> members;
      for (size_t r = 0; r < ranks_.size(); ++r)
        if (host_of_[r] == h) members.push_back(static_cast<int>(r));
      out += (h ? "; " : "") + ranks_[static_cast<size_t>(members[0])].hostname + ": " + rank_list(members);
    }
    return out;
  };
  for (size_t r = 0; r < ranks_.size(); ++r) {
    const RankHost& me = ranks_[r];
    if (!me.route.loopback) continue;
    // The nearest rank on another host that listens on a network address.
    const RankHost* other = nullptr;
    for (size_t q = 0; q < ranks_.size() && !other; ++q)
      if (host_of_[q] != host_of_[r] && !ranks_[q].route.loopback) other = &ranks_[q];
    const InterfaceAddress* reaching = nullptr;
    for (const auto& a : me.interfaces)
      if (other && !reaching && same_network(a, other->route.address)) reaching = &a;
    const std::string suggestion = reaching ? concat(" (here ", reaching->interface, ", ", reaching->address,
                                                     ", is on host ", other->hostname, "'s network)")
                                            : "";
    if (me.interface_from_env)
      throw Error(concat("rank ", r, " cannot start: GLOO_SOCKET_IFNAME=", me.route.interface,
                         " is a loopback interface, but the job's ranks are on ", hosts_, " hosts (", on_hosts(),
                         "), which cannot connect to another host's loopback; set GLOO_SOCKET_IFNAME on host ",
                         me.hostname, " to the interface that reaches the other hosts", suggestion, ", or unset it"));
    if (!reaching)
      throw Error(concat("rank ", r, " cannot start: it reaches MASTER_ADDR over loopback (", me.route.address,
                         ": rank 0's host name resolves to a loopback address on host ", me.hostname,
                         ", as Debian's /etc/hosts has it), and no interface of that host is on the network of the "
                         "other hosts (",
                         on_hosts(), "); set GLOO_SOCKET_IFNAME on host ", me.hostname,
                         " to the interface the other hosts reach, or give MASTER_ADDR as that interface's address"));
    listen_[r] = *reaching;
  }
}

std::vector<int> JobHosts::ranks_on_host_of(int r) const {
  std::vector<int> out;
  for (size_t q = 0; q < host_of_.size(); ++q)
    if (host_of_[q] == host_of_.at(static_cast<size_t>(r))) out.push_back(static_cast<int>(q));
  return out;
}

std::string JobHosts::name_host_of(int r) const {
  if (!known()) return "this host";
  return concat("host ", rank(r).hostname, " (", listen_address(r).address, ")");
}

std::string JobHosts::name_ranks(const std::vector<int>& ranks) const {
  if (!spans_hosts()) return rank_list(ranks);
  std::vector<std::pair<int, std::vector<int>>> by_host;  // host index -> ranks, in order of first appearance
  for (int r : ranks) {
    const int h = r >= 0 && r < static_cast<int>(host_of_.size()) ? host_of_[static_cast<size_t>(r)] : -1;
    auto it = std::find_if(by_host.begin(), by_host.end(), [h](const auto& e) { return e.first == h; });
    if (it == by_host.end()) it = by_host.insert(by_host.end(), {h, {}});
    it->second.push_back(r);
  }
  std::string out;
  for (size_t i = 0; i < by_host.size(); ++i) {
    const auto& [h, members] = by_host[i];
    out += (i == 0 ? "" : i + 1 == by_host.size() ? " and " : ", ") + rank_list(members);
    if (h >= 0) out += " on " + name_host_of(members[0]);
  }
  return out;
}

std::string JobHosts::summary() const {
  std::string out = concat(hosts_, hosts_ == 1 ? " host: " : " hosts: ");
  for (int h = 0; h < hosts_; ++h) {
    std::vector<int> members;
    for (size_t r = 0; r < host_of_.size(); ++r)
      if (host_of_[r] == h) members.push_back(static_cast<int>(r));
    out += concat(h ? "; " : "", rank(members[0]).hostname, " (", where(listen_address(members[0])),
                  "): ", rank_list(members));
  }
  return out;
}

}  // namespace mmsp::dist
