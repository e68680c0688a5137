// RingExchange protocol and the differentiable ring_exchange; see ring_exchange.h.
#include "mmsp/dist/ring_exchange.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "mmsp/core/check.h"

namespace mmsp::dist {

RingExchange::RingExchange(GroupPtr group, int offset, Pass pass) : group_(std::move(group)), pass_(pass) {
  const int P = group_->size(), r = group_->rank();
  to_ = ((r + offset) % P + P) % P;
  from_ = ((r - offset) % P + P) % P;
}

RingExchange::~RingExchange() {
  if (state_ != State::started) return;
  try {
    for (auto& w : work_) w->wait();
  } catch (...) {  // already failing; never throw from a destructor
  }
}

void RingExchange::start(const std::vector<at::Tensor>& send) {
  MMSP_CHECK(state_ == State::idle, "RingExchange on group ", group_->name(),
             ": start() called twice; use a new exchange for each step");
  state_ = State::started;
  if (to_ == group_->rank()) {  // offset is a multiple of the ring: nothing moves
    for (const at::Tensor& t : send) received_.push_back(t.clone());
    return;
  }
  for (const at::Tensor& given : send) {
    devices_.push_back(given.device());
    const at::Tensor t = group_->stages(given) ? given.cpu() : given;  // shared-GPU test mode
    const bool gloo = group_->uses_gloo(t);
    sent_.push_back(wire_view(t.contiguous(), gloo));
    received_.push_back(at::empty_like(t, at::MemoryFormat::Contiguous));
    const int tag = group_->next_tag();
    std::vector<at::Tensor> out{sent_.back()}, in{wire_view(received_.back(), gloo)};
    Backend& backend = group_->backend_for(t);
    work_.push_back(backend.send(out, to_, tag));
    work_.push_back(backend.recv(in, from_, tag));
    group_->stats().add(CommKind::ring_exchange, pass_, t.numel() * static_cast<int64_t>(t.element_size()));
  }
}

std::vector<at::Tensor> RingExchange::wait() {
  MMSP_CHECK(state_ != State::idle, "RingExchange on group ", group_->name(),
             ": wait() before start(): nothing was sent");
  MMSP_CHECK(state_ != State::done, "RingExchange on group ", group_->name(),
             ": wait() called twice; the received tensors were already handed out");
  state_ = State::done;
  for (auto& w : work_) group_->wait(w, "ring_exchange");
  work_.clear();
  sent_.clear();
  for (size_t i = 0; i < received_.size() && i < devices_.size(); ++i)
    if (received_[i].device() != devices_[i]) received_[i] = received_[i].to(devices_[i]);
  return std::move(received_);
}

namespace {

struct RingExchangeFunction : torch::autograd::Function<RingExchangeFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, at::TensorList send,
                                                const GroupPtr& group, int64_t offset) {
    ctx->saved_data["group"] = group_to_ivalue(group);
    ctx->saved_data["offset"] = offset;
    RingExchange exchange(group, static_cast<int>(offset), Pass::forward);
    exchange.start(send.vec());
    return exchange.wait();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    GroupPtr group = group_from_ivalue(ctx->saved_data["group"]);
    // grads are materialised (zeros for outputs the loss did not use): every
    // sender is owed a gradient, so every rank takes part in the reverse ring.
    RingExchange exchange(group, -static_cast<int>(ctx->saved_data["offset"].toInt()), Pass::backward);
    exchange.start(grads);
    torch::autograd::variable_list result = exchange.wait();
    result.push_back(at::Tensor());  // group
    result.push_back(at::Tensor());  // offset
    return result;
  }
};

}  // namespace

std::vector<at::Tensor> ring_exchange(const std::vector<at::Tensor>& send, const GroupPtr& group, int offset) {
  if (group->size() == 1) return send;
  return RingExchangeFunction::apply(at::TensorList(send), group, static_cast<int64_t>(offset));
}

}  // namespace mmsp::dist
