// The rank's device; see rank_device.h.
#include "mmsp/dist/rank_device.h"

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "mmsp/core/check.h"

namespace mmsp::dist {

DeviceRequest parse_device_request(const std::string& text) {
  if (text == "auto") return DeviceRequest::automatic;
  if (text == "cpu") return DeviceRequest::cpu;
  if (text == "cuda") return DeviceRequest::cuda;
  MMSP_FAIL("--device '", text, "' is not one of auto, cpu, cuda");
}

DeviceFacts device_facts(const std::string& visible) {
  DeviceFacts facts;
  facts.cuda_built = at::detail::getCUDAHooks().isBuilt();
  facts.gpus = at::globalContext().hasCUDA() ? static_cast<int>(at::detail::getCUDAHooks().deviceCount()) : 0;
  facts.visible = visible;
  return facts;
}

RankDevice choose_rank_device(DeviceRequest request, const DeviceFacts& facts, const RankEnv& env, bool share_gpu) {
  RankDevice chosen;
  // auto takes the GPUs only when every rank of this machine gets one of its own (the same
  // answer on each of them), so a job never runs partly on the CPU.
  if (request == DeviceRequest::cpu ||
      (request == DeviceRequest::automatic && (facts.gpus == 0 || env.local_world_size > facts.gpus)))
    return chosen;
  MMSP_CHECK(
      facts.gpus > 0,
      "--device cuda: this process sees no CUDA device (LibTorch built with CUDA: ", facts.cuda_built ? "yes" : "no",
      ", CUDA_VISIBLE_DEVICES=", facts.visible.empty() ? "unset" : "'" + facts.visible + "'", "); use --device cpu");
  if (env.local_rank >= facts.gpus) {
    MMSP_CHECK(share_gpu, "LOCAL_RANK ", env.local_rank, " needs GPU ", env.local_rank, ", but this process sees ",
               facts.gpus, ": start at most ", facts.gpus,
               " ranks per machine (one rank per GPU, NCCL's rule), or --device cpu; tests may share GPUs with "
               "MMSP_SHARE_GPU=1 (collectives staged through host memory)");
  }
  chosen.device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank % facts.gpus));
  chosen.collectives = share_gpu ? GpuCollectives::host_staged : GpuCollectives::nccl;
  return chosen;
}

RankDevice use_rank_device(DeviceRequest request, const RankEnv& env, const DeviceEnv& device_env) {
  const RankDevice chosen =
      choose_rank_device(request, device_facts(device_env.visible_devices), env, device_env.share_gpu);
  if (chosen.device.is_cuda()) c10::impl::getDeviceGuardImpl(c10::kCUDA)->setDevice(chosen.device);
  return chosen;
}

}  // namespace mmsp::dist
