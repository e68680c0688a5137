// Which device a rank computes on: --device auto|cpu|cuda, the GPUs this process sees and
// the launcher's LOCAL_RANK. One rank per GPU (NCCL's rule); a test-only mode lets several
// ranks share one GPU with their collectives staged through host memory over Gloo.
#pragma once

#include <c10/core/Device.h>

#include <string>

#include "mmsp/dist/rank_env.h"

namespace mmsp::dist {

enum class DeviceRequest { automatic, cpu, cuda };

// "auto" | "cpu" | "cuda"; anything else is an error naming the value.
DeviceRequest parse_device_request(const std::string& text);

// What this process can use: a LibTorch built with CUDA, and how many GPUs it sees.
struct DeviceFacts {
  bool cuda_built = false;
  int gpus = 0;
  std::string visible;  // CUDA_VISIBLE_DEVICES as set ("" when unset), for messages
};
// `visible`: CUDA_VISIBLE_DEVICES as the caller read it (cli/ reads the environment).
DeviceFacts device_facts(const std::string& visible = {});

// What the environment says of devices, read by cli/ (DeviceEnv::from_environment in
// cli/mesh_options.h), so that no library code reads it.
struct DeviceEnv {
  bool share_gpu = false;       // MMSP_SHARE_GPU=1 (tests only)
  std::string visible_devices;  // CUDA_VISIBLE_DEVICES, for messages
};

// How CUDA tensors cross ranks.
enum class GpuCollectives {
  none,         // CPU ranks: no NCCL group is made
  nccl,         // one rank per GPU
  host_staged,  // tests only (MMSP_SHARE_GPU=1): ranks share GPUs; Gloo on host copies
};

struct RankDevice {
  c10::Device device{c10::kCPU};
  GpuCollectives collectives = GpuCollectives::none;
};

// The rank's device (pure, for tests): auto is cuda:LOCAL_RANK where this machine has a GPU
// for each of its LOCAL_WORLD_SIZE ranks, else the CPU; cuda without a GPU, or LOCAL_RANK
// past the GPUs (unless `share_gpu`), is an error that names the value and the rule.
RankDevice choose_rank_device(DeviceRequest request, const DeviceFacts& facts, const RankEnv& env, bool share_gpu);

// choose_rank_device with this process's facts and `device_env`, and the chosen GPU made
// the current one (NCCL's communicators and the caching allocator use it).
RankDevice use_rank_device(DeviceRequest request, const RankEnv& env, const DeviceEnv& device_env);

}  // namespace mmsp::dist
