// Single-process tests of dist/: environment parsing, mesh arithmetic, byte
// counters, wire dtypes and the RingExchange protocol.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <set>
#include <thread>

#include "mmsp/core/check.h"
#include "mmsp/dist/comm_stats.h"
#include "mmsp/dist/flag_agreement.h"
#include "mmsp/dist/group.h"
#include "mmsp/dist/heartbeat.h"
#include "mmsp/dist/host_network.h"
#include "mmsp/dist/job_hosts.h"
#include "mmsp/dist/rank_device.h"
#include "mmsp/dist/rank_env.h"
#include "mmsp/dist/ring_exchange.h"
#include "mmsp/dist/startup_deadline.h"
#include "mmsp/plan/mesh.h"

using namespace mmsp;
using namespace mmsp::dist;
using mmsp::plan::MeshAxis;
using ::testing::HasSubstr;
using ::testing::Not;

// Expects `fn` to throw mmsp::Error whose message contains `text`.
template <typename Fn>
void expect_error(Fn&& fn, const std::string& text) {
  try {
    fn();
    ADD_FAILURE() << "expected an mmsp::Error containing '" << text << "'";
  } catch (const Error& e) { EXPECT_THAT(e.what(), HasSubstr(text)); }
}

TEST(RankEnvTest, TorchrunVariables) {
  RankEnv env = rank_env_from({{"RANK", "5"},
                               {"WORLD_SIZE", "8"},
                               {"LOCAL_RANK", "1"},
                               {"LOCAL_WORLD_SIZE", "4"},
                               {"MASTER_ADDR", "node0"},
                               {"MASTER_PORT", "29123"},
                               {"GLOO_SOCKET_IFNAME", "eth1"}});
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(env.master_addr, "node0");
  EXPECT_EQ(env.master_port, 29123);
  EXPECT_EQ(env.gloo_interface, "eth1");
  EXPECT_EQ(env.launcher, "torchrun");
}

TEST(RankEnvTest, OpenMpiVariables) {
  RankEnv env = rank_env_from({{"OMPI_COMM_WORLD_RANK", "3"},
                               {"OMPI_COMM_WORLD_SIZE", "4"},
                               {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                               {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                               {"MASTER_ADDR", "h1"}});
  EXPECT_EQ(env.launcher, "openmpi");
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.master_port, 29500);
}

TEST(RankEnvTest, SlurmVariables) {
  RankEnv env = rank_env_from({{"SLURM_PROCID", "6"},
                               {"SLURM_NTASKS", "8"},
                               {"SLURM_LOCALID", "2"},
                               {"SLURM_TASKS_PER_NODE", "4(x2)"},
                               {"MASTER_ADDR", "n7"},
                               {"MASTER_PORT", "4000"}});
  EXPECT_EQ(env.launcher, "slurm");
  EXPECT_EQ(env.rank, 6);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 2);
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(env.master_addr, "n7");
}

TEST(RankEnvTest, NothingSetMeansOneRank) {
  RankEnv env = rank_env_from({});
  EXPECT_EQ(env.launcher, "single");
  EXPECT_EQ(env.world_size, 1);
  EXPECT_EQ(env.rank, 0);
}

TEST(RankEnvTest, BadValuesNameTheVariable) {
  expect_error([] { rank_env_from({{"RANK", "x"}, {"WORLD_SIZE", "2"}}); }, "RANK='x'");
  expect_error([] { rank_env_from({{"RANK", "2"}, {"WORLD_SIZE", "2"}}); }, "rank 2 is not below the world size 2");
  expect_error([] { rank_env_from({{"RANK", "0"}}); }, "RANK and WORLD_SIZE must be set");
  expect_error(
      [] {
        rank_env_from({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}});
      },
      "MASTER_PORT=70000");
  expect_error(
      [] {
        rank_env_from({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}});
      },
      "MASTER_ADDR must name rank 0's host");
}

// The rank's device from --device, the GPUs seen and LOCAL_RANK (pure: no GPU needed).
TEST(RankDeviceTest, AutoCpuCudaAndTheRankWithoutAGpu) {
  RankEnv env;
  env.local_rank = 1;
  env.local_world_size = 2;
  const DeviceFacts none{true, 0, ""}, one{true, 1, "0"}, two{true, 2, ""};
  EXPECT_TRUE(choose_rank_device(DeviceRequest::automatic, none, env, false).device.is_cpu());
  // auto: a GPU for each local rank or none at all (never a job partly on the CPU)
  EXPECT_TRUE(choose_rank_device(DeviceRequest::automatic, one, env, false).device.is_cpu());
  const RankDevice cuda = choose_rank_device(DeviceRequest::automatic, two, env, false);
  EXPECT_EQ(cuda.device, c10::Device(c10::kCUDA, 1));
  EXPECT_EQ(cuda.collectives, GpuCollectives::nccl);
  EXPECT_TRUE(choose_rank_device(DeviceRequest::cpu, two, env, false).device.is_cpu());
  EXPECT_EQ(choose_rank_device(DeviceRequest::cpu, two, env, false).collectives, GpuCollectives::none);
  expect_error(
      [&] { choose_rank_device(DeviceRequest::cuda, none, env, false); },
      "--device cuda: this process sees no CUDA device (LibTorch built with CUDA: yes, CUDA_VISIBLE_DEVICES=unset)");
  expect_error([&] { choose_rank_device(DeviceRequest::cuda, one, env, false); },
               "LOCAL_RANK 1 needs GPU 1, but this process sees 1: start at most 1 ranks per machine");
  // the test-only shared mode: rank 1 on GPU 0, collectives through host memory
  const RankDevice shared = choose_rank_device(DeviceRequest::cuda, one, env, true);
  EXPECT_EQ(shared.device, c10::Device(c10::kCUDA, 0));
  EXPECT_EQ(shared.collectives, GpuCollectives::host_staged);
  expect_error([] { parse_device_request("gpu"); }, "--device 'gpu' is not one of auto, cpu, cuda");
  EXPECT_EQ(parse_device_request("cuda"), DeviceRequest::cuda);
}

TEST(MeshTest, WorldMustBeTheProduct) {
  expect_error([] { plan::validate_mesh({1, 2, 2}, 6); }, "world size 6 is not dp(1) × ring(2) × ulysses(2) = 4");
  expect_error([] { plan::validate_mesh({0, 2, 2}, 0); }, "mesh factors must be >= 1");
  EXPECT_NO_THROW(plan::validate_mesh({2, 1, 2}, 4));
}

TEST(MeshTest, ParseAndEnumerate) {
  plan::Mesh s = plan::parse_mesh("2x3x4");
  EXPECT_EQ(s.dp, 2);
  EXPECT_EQ(s.ring, 3);
  EXPECT_EQ(s.ulysses, 4);
  expect_error([] { plan::parse_mesh("2x3"); }, "must read DPxRINGxULYSSES");
  expect_error([] { plan::parse_mesh("1x2x2x"); }, "must read DPxRINGxULYSSES");
  EXPECT_EQ(plan::all_meshes(4).size(), 6u);  // 4 = 1·1·4 1·2·2 1·4·1 2·1·2 2·2·1 4·1·1
  EXPECT_EQ(plan::all_meshes(1).size(), 1u);
  for (const plan::Mesh& m : plan::all_meshes(12)) EXPECT_EQ(m.world(), 12);
}

TEST(MeshTest, UlyssesVariesFastestThenRingThenDp) {
  plan::Mesh shape{2, 3, 2};
  EXPECT_EQ(plan::rank_coords(shape, 0).ulysses, 0);
  EXPECT_EQ(plan::rank_coords(shape, 1).ulysses, 1);
  EXPECT_EQ(plan::rank_coords(shape, 2).ring, 1);
  EXPECT_EQ(plan::rank_coords(shape, 6).dp, 1);
  EXPECT_EQ(plan::group_members(shape, MeshAxis::ulysses, 7), (std::vector<int>{6, 7}));
  EXPECT_EQ(plan::group_members(shape, MeshAxis::ring, 7), (std::vector<int>{7, 9, 11}));
  EXPECT_EQ(plan::group_members(shape, MeshAxis::dp, 7), (std::vector<int>{1, 7}));
  EXPECT_EQ(plan::group_members(shape, MeshAxis::context, 7), (std::vector<int>{6, 7, 8, 9, 10, 11}));
}

// Every axis's groups partition the world, each rank sits in exactly one group
// per axis at its own coordinate, and every rank agrees on its group's members.
TEST(MeshTest, GroupsPartitionTheWorldForEveryShape) {
  for (int world = 1; world <= 12; ++world)
    for (const plan::Mesh& shape : plan::all_meshes(world))
      for (MeshAxis axis : {MeshAxis::world, MeshAxis::dp, MeshAxis::ring, MeshAxis::ulysses, MeshAxis::context}) {
        std::multiset<int> seen;
        for (int rank = 0; rank < world; ++rank) {
          EXPECT_EQ(global_rank(shape, plan::rank_coords(shape, rank)), rank);
          auto members = plan::group_members(shape, axis, rank);
          for (int m : members) EXPECT_EQ(plan::group_members(shape, axis, m), members);
          if (members.front() == rank) seen.insert(members.begin(), members.end());
        }
        EXPECT_EQ(seen.size(), static_cast<size_t>(world)) << shape.str() << " " << plan::axis_name(axis);
        for (int rank = 0; rank < world; ++rank) EXPECT_EQ(seen.count(rank), 1u);
      }
}

TEST(CommStatsTest, CountsPerKindAndPass) {
  CommStats stats;
  stats.add(CommKind::all_to_all, Pass::forward, 100);
  stats.add(CommKind::all_to_all, Pass::forward, 20);
  stats.add(CommKind::all_to_all, Pass::backward, 7);
  CommSnapshot a = stats.snapshot();
  EXPECT_EQ(a.at(CommKind::all_to_all, Pass::forward).bytes, 120);
  EXPECT_EQ(a.at(CommKind::all_to_all, Pass::forward).calls, 2);
  EXPECT_EQ(a.at(CommKind::all_to_all, Pass::backward).bytes, 7);
  EXPECT_EQ(a.total_bytes(), 127);
  stats.add(CommKind::ring_exchange, Pass::forward, 3);
  EXPECT_EQ((stats.snapshot() - a).total_bytes(), 3);
  stats.reset();
  EXPECT_EQ(stats.snapshot().total_bytes(), 0);
}

TEST(WireViewTest, GlooGetsSameSizeTypesWithTheSameBits) {
  at::Tensor bf = at::arange(10, at::kFloat).to(at::kBFloat16);
  at::Tensor wire = wire_view(bf, /*gloo=*/true);
  EXPECT_EQ(wire.scalar_type(), at::kHalf);
  EXPECT_EQ(wire.data_ptr(), bf.data_ptr());
  EXPECT_EQ(wire_view(bf, /*gloo=*/false).scalar_type(), at::kBFloat16);
  EXPECT_EQ(wire_view(at::zeros({3}, at::kBool), true).scalar_type(), at::kByte);
  EXPECT_EQ(wire_view(at::zeros({3}, at::kShort), true).scalar_type(), at::kHalf);
  EXPECT_EQ(wire_view(at::zeros({3}, at::kDouble), true).scalar_type(), at::kDouble);
}

TEST(RingExchangeTest, ProtocolRefusesMisuse) {
  GroupPtr solo = make_solo_group("solo", 0);
  {
    RingExchange exchange(solo);
    expect_error([&] { exchange.wait(); }, "wait() before start()");
    exchange.start({at::ones({2})});
    expect_error([&] { exchange.start({at::ones({2})}); }, "start() called twice");
    auto got = exchange.wait();
    ASSERT_EQ(got.size(), 1u);
    EXPECT_TRUE(got[0].equal(at::ones({2})));
    expect_error([&] { exchange.wait(); }, "wait() called twice");
  }
}

// --- the flags every rank must share (flag_agreement.h) -------------------------------

TEST(FlagAgreement, EncodingRoundTripsAnyBytes) {
  const AgreedFlags flags = {{"--lr", "0.001"}, {"--data", "a:b 3:c\n\t;=x"}, {"--save-dtype", ""}, {"", "7"}};
  AgreedFlags back;
  ASSERT_TRUE(decode_flags(encode_flags(flags), back));
  EXPECT_EQ(back, flags);
  ASSERT_TRUE(decode_flags("", back));
  EXPECT_TRUE(back.empty());
}

TEST(FlagAgreement, MalformedTextIsRefusedNotRead) {
  AgreedFlags out;
  for (const std::string bad :
       {"4:--lr", "x:--lr5:0.001", "3:abc", "3:abc9999999999:x", ":a", "5:--lr5:0.001", "2:ab3"})
    EXPECT_FALSE(decode_flags(bad, out)) << bad;
}

TEST(FlagAgreement, NamesEachDifferingFlagWithTheRanksOfEachValue) {
  const AgreedFlags a = {{"--lr", "0.001"}, {"--dtype", "float32"}, {"--seed", "0"}};
  AgreedFlags b = a, c = a;
  b[0].second = "0.01";
  c[1].second = "float64";
  EXPECT_EQ(flag_disagreement({a, a, a}), "");
  const std::string m = flag_disagreement({a, b, a, c});
  EXPECT_THAT(m, HasSubstr("different flags: --lr is 0.001 on ranks 0, 2, 3 and 0.01 on rank 1; "
                           "--dtype is float32 on ranks 0, 1, 2 and float64 on rank 3."));
  EXPECT_THAT(m, Not(HasSubstr("--seed")));
  EXPECT_THAT(m, HasSubstr("stopped before the first collective"));
  AgreedFlags unset = a;
  unset[2].second = "";
  EXPECT_THAT(flag_disagreement({a, unset}), HasSubstr("--seed is 0 on rank 0 and (unset) on rank 1"));
  // another mmsp build sends another list: named as such, not compared field by field
  AgreedFlags shorter = {a[0]};
  EXPECT_THAT(flag_disagreement({a, a, shorter}), HasSubstr("rank 2 sent another list of flags than rank 0"));
}

TEST(FlagAgreement, NumbersAreExactAndShort) {
  EXPECT_EQ(exact_number(0.001), "0.001");
  EXPECT_EQ(exact_number(1e-3), exact_number(0.001));
  EXPECT_EQ(exact_number(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(std::stod(exact_number(1.0 / 3.0)), 1.0 / 3.0);
  EXPECT_EQ(exact_number(300), "300");
}

TEST(StartupDeadlineTest, MessagesNameTheRankTheStageAndThePlace) {
  EXPECT_EQ(StartupDeadline::message(1, 5, StartupDeadline::kConnecting, "h:29500").substr(0, 87),
            "rank 0 did not join within 5 s: rank 1 is still connecting to rank 0's store at h:29500");
  EXPECT_THAT(StartupDeadline::message(2, 7.5, "waiting for every rank to join", "h:1"),
              HasSubstr("rank 2: start-up did not finish within 7.5 s: still waiting for every rank to join at h:1"));
}

TEST(StartupDeadlineTest, ADisarmedDeadlineNeverFires) {
  // Armed for 50 ms (+ the slack) and disarmed at once: the process goes on (were it to
  // fire, it would end this test binary with status 2).
  { StartupDeadline d(0, std::chrono::milliseconds(50), "h:1", "testing"); }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  SUCCEED();
}

TEST(StartupDeadlineDeathTest, StillArmedAtItsDeadlineItEndsTheProcessNamingTheStage) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        StartupDeadline d(3, std::chrono::milliseconds(100), "h:1", "testing the deadline");
        std::this_thread::sleep_for(std::chrono::seconds(20));  // a call that never returns
      },
      ::testing::ExitedWithCode(kStartupExitCode),
      "rank 3: start-up did not finish within 0.1 s: still testing the deadline at h:1");
}

// --- the job's hosts (job_hosts.h): every rank's listening address, chosen alike ---------

namespace {
InterfaceAddress address(const std::string& interface, const std::string& addr, int prefix, bool loopback = false) {
  InterfaceAddress a;
  a.interface = interface;
  a.address = addr;
  a.prefix_length = prefix;
  a.loopback = loopback;
  return a;
}
// Two ranks on host "node0" (10.9.0.1 on veth0), two on "node1" (10.9.0.2 on veth1).
std::vector<RankHost> two_hosts() {
  std::vector<RankHost> ranks(4);
  for (int r = 0; r < 4; ++r) {
    const int h = r / 2;
    ranks[r].key = "boot/" + std::to_string(4026531840 + h);
    ranks[r].hostname = "node" + std::to_string(h);
    ranks[r].route = address("veth" + std::to_string(h), "10.9.0." + std::to_string(h + 1), 24);
    ranks[r].interfaces = {address("veth" + std::to_string(h), "10.9.0." + std::to_string(h + 1), 24),
                           address("eth0", "192.168.7." + std::to_string(h + 1), 16)};
  }
  return ranks;
}
}  // namespace

TEST(JobHosts, RecordsRoundTripAnyBytesAndRefuseDamage) {
  RankHost h = two_hosts()[3];
  h.hostname = std::string("odd\0name:7:", 12);
  h.interface_from_env = true;
  RankHost back;
  ASSERT_TRUE(decode_rank_host(encode_rank_host(h), back));
  EXPECT_EQ(back.key, h.key);
  EXPECT_EQ(back.hostname, h.hostname);
  EXPECT_EQ(back.route.address, "10.9.0.2");
  EXPECT_EQ(back.route.prefix_length, 24);
  EXPECT_TRUE(back.interface_from_env);
  ASSERT_EQ(back.interfaces.size(), 2u);
  EXPECT_EQ(back.interfaces[1].address, "192.168.7.2");
  const std::string text = encode_rank_host(h);
  for (size_t cut = 0; cut < text.size(); ++cut) EXPECT_FALSE(decode_rank_host(text.substr(0, cut), back)) << cut;
}

TEST(JobHosts, OneHostKeepsEveryRouteLoopbackIncluded) {
  std::vector<RankHost> ranks(3);
  for (auto& r : ranks) r.key = "boot/1", r.hostname = "box", r.route = address("lo", "127.0.0.1", 8, true);
  const JobHosts hosts(ranks);
  EXPECT_FALSE(hosts.spans_hosts());
  EXPECT_EQ(hosts.listen_address(2).address, "127.0.0.1");
  EXPECT_EQ(hosts.name_ranks({1, 2}), "ranks 1, 2");  // one host: messages as before
}

TEST(JobHosts, TwoHostsNameEachRanksHost) {
  const JobHosts hosts(two_hosts());
  EXPECT_TRUE(hosts.spans_hosts());
  EXPECT_EQ(hosts.host_count(), 2);
  EXPECT_EQ(hosts.ranks_on_host_of(3), (std::vector<int>{2, 3}));
  EXPECT_EQ(hosts.name_ranks({2, 3}), "ranks 2, 3 on host node1 (10.9.0.2)");
  EXPECT_EQ(hosts.name_ranks({3, 0}), "rank 3 on host node1 (10.9.0.2) and rank 0 on host node0 (10.9.0.1)");
  EXPECT_EQ(hosts.summary(), "2 hosts: node0 (10.9.0.1 on veth0): ranks 0, 1; node1 (10.9.0.2 on veth1): ranks 2, 3");
}

TEST(JobHosts, ALoopbackRouteAcrossHostsTakesTheInterfaceOnTheOtherHostsNetwork) {
  // Debian's /etc/hosts maps the host's own name to 127.0.1.1: rank 0's host reaches
  // MASTER_ADDR (its own name) over loopback. Its interface on node1's network is chosen.
  std::vector<RankHost> ranks = two_hosts();
  ranks[0].route = ranks[1].route = address("lo", "127.0.1.1", 8, true);
  const JobHosts hosts(ranks);
  EXPECT_EQ(hosts.listen_address(0).address, "10.9.0.1");
  EXPECT_EQ(hosts.listen_address(1).interface, "veth0");
  EXPECT_EQ(hosts.listen_address(2).address, "10.9.0.2");
}

TEST(JobHosts, ALoopbackThatCannotReachTheOtherHostsIsRefusedAlikeOnEveryRank) {
  std::vector<RankHost> ranks = two_hosts();
  ranks[2].route = ranks[3].route = address("lo", "127.0.0.1", 8, true);
  ranks[2].interfaces = ranks[3].interfaces = {address("wlan0", "172.16.0.9", 24)};  // not node0's network
  expect_error([&] { JobHosts{ranks}; },
               "rank 2 cannot start: it reaches MASTER_ADDR over loopback (127.0.0.1: rank 0's host name resolves to "
               "a loopback address on host node1");
  ranks = two_hosts();
  ranks[3].route = address("lo", "127.0.0.1", 8, true);
  ranks[3].interface_from_env = true;
  expect_error([&] { JobHosts{ranks}; },
               "rank 3 cannot start: GLOO_SOCKET_IFNAME=lo is a loopback interface, but the job's ranks are on 2 hosts "
               "(node0: ranks 0, 1; node1: ranks 2, 3), which cannot connect to another host's loopback; set "
               "GLOO_SOCKET_IFNAME on host node1 to the interface that reaches the other hosts (here veth1, 10.9.0.2, "
               "is on host node0's network), or unset it");
}

TEST(HostNetwork, AddressesNetworksAndThisHost) {
  EXPECT_TRUE(is_loopback_address("127.0.1.1"));
  EXPECT_TRUE(is_loopback_address("::1"));
  EXPECT_FALSE(is_loopback_address("10.0.0.1"));
  EXPECT_FALSE(is_loopback_address("node0"));  // names are not numeric addresses
  EXPECT_TRUE(same_network(address("e", "10.9.0.1", 24), "10.9.0.200"));
  EXPECT_FALSE(same_network(address("e", "10.9.0.1", 24), "10.9.1.2"));
  EXPECT_TRUE(same_network(address("e", "10.9.0.1", 15), "10.8.3.4"));
  EXPECT_FALSE(same_network(address("e", "10.9.0.1", 24), "fd00::1"));
  EXPECT_TRUE(same_network(address("e", "fd00:1::5", 64), "fd00:1::9"));
  const HostIdentity me = this_host();
  EXPECT_FALSE(me.key.empty());
  EXPECT_EQ(me.key, this_host().key);
  // The loopback route: what a one-host job (MASTER_ADDR 127.0.0.1) listens on.
  const InterfaceAddress lo = local_address_towards("127.0.0.1", 29500);
  EXPECT_EQ(lo.address, "127.0.0.1");
  EXPECT_TRUE(lo.loopback);
  expect_error([] { address_of_interface("no-such-nic0"); },
               "GLOO_SOCKET_IFNAME=no-such-nic0: this host has no interface of that name");
  expect_error([] { local_address_towards("no-such-host.invalid", 1); },
               "MASTER_ADDR 'no-such-host.invalid' does not resolve on this host");
}

TEST(HeartbeatMessage, AHostCutOffIsNamedAsOne) {
  const JobHosts hosts(two_hosts());
  HeartbeatValue last{12, 7, "forward"};
  EXPECT_EQ(heartbeat_failure_message({2, 3}, 10.44, last, hosts),
            "ranks 2, 3 on host node1 (10.9.0.2) have not answered for 10.4 s (last seen in step 7, phase forward); "
            "they are stopped, wedged or unreachable (every rank of host node1 (10.9.0.2): the host is down, stopped "
            "or cut off from the network). The job is ended (--heartbeat-timeout)");
  EXPECT_EQ(heartbeat_failure_message(2, 3.25, last),
            "rank 2 has not answered for 3.2 s (last seen in step 7, phase forward); it is stopped, wedged or "
            "unreachable. The job is ended (--heartbeat-timeout)");
}

TEST(FlagAgreement, ValueDifferencesNameTheRanksHosts) {
  const JobHosts hosts(two_hosts());
  const std::vector<AgreedFlags> per_rank = {
      {{"--out", "runs/a"}}, {{"--out", "runs/a"}}, {{"--out", ""}}, {{"--out", ""}}};
  EXPECT_EQ(
      value_disagreement(per_rank, [&](const std::vector<int>& r) { return hosts.name_ranks(r); }),
      "--out is runs/a on ranks 0, 1 on host node0 (10.9.0.1) and (unset) on ranks 2, 3 on host node1 (10.9.0.2)");
  EXPECT_EQ(value_disagreement(per_rank), "--out is runs/a on ranks 0, 1 and (unset) on ranks 2, 3");
}
