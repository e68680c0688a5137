// The job's hosts as the rendezvous saw them. Each rank posts its host (host_network.h),
// the local address it reaches rank 0's host from (or GLOO_SOCKET_IFNAME's) and its
// host's interfaces; from those every rank computes the same verdict: the address each
// rank's Gloo listens on, or the refusal of a rank that could listen only on loopback
// while its peers are on other hosts. Messages name a rank's host through it.
#pragma once

#include <string>
#include <vector>

#include "mmsp/dist/host_network.h"

namespace mmsp::dist {

struct RankHost {
  std::string key;                           // HostIdentity::key: equal keys share a loopback
  std::string hostname;                      // for messages
  InterfaceAddress route;                    // towards MASTER_ADDR, or GLOO_SOCKET_IFNAME's address
  bool interface_from_env = false;           // route is GLOO_SOCKET_IFNAME's
  std::vector<InterfaceAddress> interfaces;  // the host's addresses that are not loopback
};

// This rank's record: `gloo_interface` is GLOO_SOCKET_IFNAME ("" when unset). Throws
// mmsp::Error naming the variable or MASTER_ADDR when neither gives an address.
RankHost describe_this_rank(const std::string& master_addr, int master_port, const std::string& gloo_interface);

// Length-prefixed (flag_agreement.h's encoding), exact for any bytes; decode gives
// false on anything malformed.
std::string encode_rank_host(const RankHost& host);
bool decode_rank_host(const std::string& text, RankHost& out);

class JobHosts {
 public:
  JobHosts() = default;  // one rank, or ranks met without a rendezvous: names ranks alone
  // Chooses every rank's listening address; throws mmsp::Error, the same text on every
  // rank, when a rank of a job that spans hosts could listen only on loopback.
  explicit JobHosts(std::vector<RankHost> ranks);

  bool known() const { return !ranks_.empty(); }
  bool spans_hosts() const { return hosts_ > 1; }
  int host_count() const { return hosts_; }
  const RankHost& rank(int r) const { return ranks_.at(static_cast<size_t>(r)); }
  // The address rank r's Gloo listens on: its route, unless that is loopback in a job
  // that spans hosts (then its host's interface on another host's network).
  const InterfaceAddress& listen_address(int r) const { return listen_.at(static_cast<size_t>(r)); }
  // The ranks that share rank r's host, in order.
  std::vector<int> ranks_on_host_of(int r) const;

  // "rank 3" / "ranks 2, 3" on one host; across hosts each group says where it is:
  // "ranks 2, 3 on host node1 (10.0.0.2)", "rank 0 on host node0 (10.0.0.1) and rank 3 on
  // host node1 (10.0.0.2)".
  std::string name_ranks(const std::vector<int>& ranks) const;
  // "host node1 (10.0.0.2)"
  std::string name_host_of(int r) const;
  // One line for the start of a multi-host job: "2 hosts: node0 (10.0.0.1 on veth0):
  // ranks 0, 1; node1 (10.0.0.2 on veth1): ranks 2, 3".
  std::string summary() const;

 private:
  std::vector<RankHost> ranks_;
  std::vector<InterfaceAddress> listen_;
  std::vector<int> host_of_;  // rank -> host index, in order of first rank
  int hosts_ = 0;
};

}  // namespace mmsp::dist
