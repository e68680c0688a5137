// What this process can tell about its host's network before any rank connects: which
// machine and network namespace it runs in (ranks that share both share a loopback),
// which local address the kernel would use to reach a peer, and the host's interfaces.
// Plain POSIX (getaddrinfo, a connected UDP socket that never sends, getifaddrs); the
// choice of the address Gloo binds from these facts is job_hosts.h's.
#pragma once

#include <string>
#include <vector>

namespace mmsp::dist {

// Ranks with the same key can reach each other over loopback: the same machine (its
// boot id) and the same network namespace (its inode). Two network namespaces on one
// machine are two hosts, as two machines are.
struct HostIdentity {
  std::string key;
  std::string hostname;  // gethostname(): for messages only (namespaces may share it)
};
HostIdentity this_host();

// One address of an interface of this host: "veth0", "10.0.0.1", 24.
struct InterfaceAddress {
  std::string interface;
  std::string address;  // numeric IPv4 or IPv6
  int prefix_length = 0;
  bool loopback = false;
};

// Every address of every interface that is up, loopback included (getifaddrs).
std::vector<InterfaceAddress> host_interfaces();

// True for 127.0.0.0/8 and ::1 (numeric addresses).
bool is_loopback_address(const std::string& address);

// The local address (and its interface) the kernel picks to reach host:port, from a UDP
// socket connected to it (no packet is sent). Throws mmsp::Error naming `host` when it
// does not resolve or no route reaches it.
InterfaceAddress local_address_towards(const std::string& host, int port);

// The first address of interface `name` (GLOO_SOCKET_IFNAME); throws mmsp::Error naming
// it and the interfaces this host has when it has none of that name or no address.
InterfaceAddress address_of_interface(const std::string& name);

// Is numeric `address` inside the network of `of` (same family, first prefix_length bits)?
bool same_network(const InterfaceAddress& of, const std::string& address);

}  // namespace mmsp::dist
