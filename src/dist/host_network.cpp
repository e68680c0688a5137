// This host's identity, interfaces and routes; see host_network.h.
#include "mmsp/dist/host_network.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "mmsp/core/check.h"

namespace mmsp::dist {
namespace {

using detail::concat;

std::string numeric(const sockaddr* sa) {
  char text[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET)
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, text, sizeof text);
  else if (sa->sa_family == AF_INET6)
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, text, sizeof text);
  return text;
}

int prefix_of(const sockaddr* mask) {
  if (!mask) return 0;
  const unsigned char* bytes = nullptr;
  size_t n = 0;
  if (mask->sa_family == AF_INET) {
    bytes = reinterpret_cast<const unsigned char*>(&reinterpret_cast<const sockaddr_in*>(mask)->sin_addr);
    n = 4;
  } else if (mask->sa_family == AF_INET6) {
    bytes = reinterpret_cast<const unsigned char*>(&reinterpret_cast<const sockaddr_in6*>(mask)->sin6_addr);
    n = 16;
  }
  int bits = 0;
  for (size_t i = 0; i < n; ++i) bits += __builtin_popcount(bytes[i]);
  return bits;
}

// Numeric address -> its bytes (4 or 16); empty when it is not numeric.
std::string address_bytes(const std::string& address) {
  unsigned char buffer[16];
  if (::inet_pton(AF_INET, address.c_str(), buffer) == 1) return std::string(reinterpret_cast<char*>(buffer), 4);
  if (::inet_pton(AF_INET6, address.c_str(), buffer) == 1) return std::string(reinterpret_cast<char*>(buffer), 16);
  return "";
}

std::string first_line_of(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string interface_names(const std::vector<InterfaceAddress>& all) {
  std::string names;
  for (const auto& a : all) names += (names.empty() ? "" : ", ") + a.interface + " " + a.address;
  return names.empty() ? "none" : names;
}

}  // namespace

HostIdentity this_host() {
  HostIdentity host;
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  host.hostname = name;
  // The machine: its boot id (a fresh UUID each boot); the namespace: its inode.
  std::string machine = first_line_of("/proc/sys/kernel/random/boot_id");
  if (machine.empty()) machine = host.hostname;
  struct stat ns {};
  const std::string net = ::stat("/proc/self/ns/net", &ns) == 0 ? std::to_string(ns.st_ino) : "?";
  host.key = machine + "/" + net;
  return host;
}

bool is_loopback_address(const std::string& address) {
  const std::string b = address_bytes(address);
  if (b.size() == 4) return static_cast<unsigned char>(b[0]) == 127;
  if (b.size() == 16) return b == std::string(15, '\0') + '\1';
  return false;
}

std::vector<InterfaceAddress> host_interfaces() {
  std::vector<InterfaceAddress> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (const ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr || !(a->ifa_flags & IFF_UP)) continue;
    if (a->ifa_addr->sa_family != AF_INET && a->ifa_addr->sa_family != AF_INET6) continue;
    InterfaceAddress one;
    one.interface = a->ifa_name;
    one.address = numeric(a->ifa_addr);
    one.prefix_length = prefix_of(a->ifa_netmask);
    one.loopback = (a->ifa_flags & IFF_LOOPBACK) != 0 || is_loopback_address(one.address);
    out.push_back(one);
  }
  ::freeifaddrs(list);
  return out;
}

InterfaceAddress local_address_towards(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  MMSP_CHECK(rc == 0 && found, "MASTER_ADDR '", host, "' does not resolve on this host (", ::gai_strerror(rc),
             "): every host of the job must resolve it to rank 0's host (DNS or /etc/hosts), or give its address");
  std::string last_error;
  InterfaceAddress result;
  for (const addrinfo* a = found; a && result.address.empty(); a = a->ai_next) {
    const int fd = ::socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t length = sizeof local;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0) {
      result.address = numeric(reinterpret_cast<const sockaddr*>(&local));
    } else {
      last_error = std::strerror(errno);
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  MMSP_CHECK(!result.address.empty(), "no route from this host to MASTER_ADDR '", host, "' (", last_error,
             "): is this host on the network of rank 0's host?");
  result.loopback = is_loopback_address(result.address);
  for (const auto& a : host_interfaces())
    if (a.address == result.address) {
      result.interface = a.interface;
      result.prefix_length = a.prefix_length;
      result.loopback = result.loopback || a.loopback;
      break;
    }
  return result;
}

InterfaceAddress address_of_interface(const std::string& name) {
  const std::vector<InterfaceAddress> all = host_interfaces();
  // IPv4 first: Gloo's interface lookup prefers it too.
  for (int want_v6 = 0; want_v6 < 2; ++want_v6)
    for (const auto& a : all)
      if (a.interface == name && (address_bytes(a.address).size() == 16) == (want_v6 == 1)) return a;
  throw Error(concat("GLOO_SOCKET_IFNAME=", name, ": this host has no interface of that name with an address that is ",
                     "up (it has: ", interface_names(all), ")"));
}

bool same_network(const InterfaceAddress& of, const std::string& address) {
  const std::string a = address_bytes(of.address), b = address_bytes(address);
  if (a.empty() || a.size() != b.size() || of.prefix_length <= 0) return false;
  const int bits = std::min<int>(of.prefix_length, static_cast<int>(a.size()) * 8);
  for (int i = 0; i < bits; ++i) {
    const int byte = i / 8, bit = 7 - i % 8;
    if (((a[byte] >> bit) & 1) != ((b[byte] >> bit) & 1)) return false;
  }
  return true;
}

}  // namespace mmsp::dist
