// AdamW state by name; see optimizer_state.h.
#include "mmsp/train/optim/optimizer_state.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <set>
#include <unordered_map>

#include "mmsp/compat/optimizer_state_key.h"
#include "mmsp/core/check.h"
#include "mmsp/core/json_read.h"

namespace mmsp::train {
namespace {

using nlohmann::json;

constexpr const char* kFormat = "mmsp.adamw";
const char* const kMoments[] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};

// TensorImpl -> the first name it is given.
std::unordered_map<const void*, std::string> names_of(const model::NamedParams& params) {
  std::unordered_map<const void*, std::string> out;
  for (const auto& [name, p] : params) out.emplace(p.unsafeGetTensorImpl(), name);
  return out;
}

model::NamedParams named(const torch::nn::Module& model) {
  model::NamedParams out;
  for (const auto& item : model.named_parameters()) out.emplace_back(item.key(), item.value());
  return out;
}

const torch::optim::AdamWOptions& adamw_options(const torch::optim::OptimizerParamGroup& group, size_t index) {
  const auto* options = dynamic_cast<const torch::optim::AdamWOptions*>(&group.options());
  MMSP_ASSERT(options != nullptr, "param group ", index, " of an AdamW has other options");
  return *options;
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return "[" + out + "]";
}

}  // namespace

AdamWState capture_adamw_state(const torch::optim::AdamW& optimizer, const torch::nn::Module& model) {
  return capture_adamw_state(optimizer, named(model));
}

AdamWState capture_adamw_state(const torch::optim::AdamW& optimizer, const model::NamedParams& params) {
  const auto names = names_of(params);
  AdamWState out;
  for (size_t g = 0; g < optimizer.param_groups().size(); ++g) {
    const auto& group = optimizer.param_groups()[g];
    const auto& o = adamw_options(group, g);
    AdamWGroupState gs{o.lr(), {std::get<0>(o.betas()), std::get<1>(o.betas())}, o.eps(), o.weight_decay(), o.amsgrad(),
                       {}};
    for (size_t i = 0; i < group.params().size(); ++i) {
      const at::Tensor& p = group.params()[i];
      auto name = names.find(p.unsafeGetTensorImpl());
      MMSP_CHECK(name != names.end(), "saving the optimizer: parameter #", i, " of group ", g, " (shape ", p.sizes(),
                 ") is not a parameter of the model");
      gs.params.push_back(name->second);
      auto it = optimizer.state().find(compat::optimizer_state_key(p));
      if (it == optimizer.state().end()) continue;
      const auto* s = dynamic_cast<const torch::optim::AdamWParamState*>(it->second.get());
      MMSP_ASSERT(s != nullptr, "AdamW state of ", name->second, " has another type");
      out.params[name->second] = {s->step(), s->exp_avg(), s->exp_avg_sq(), s->max_exp_avg_sq()};
    }
    out.groups.push_back(std::move(gs));
  }
  return out;
}

void apply_adamw_state(const AdamWState& state, torch::optim::AdamW& optimizer, const torch::nn::Module& model,
                       const std::string& source) {
  apply_adamw_state(state, optimizer, named(model), source);
}

void apply_adamw_state(const AdamWState& state, torch::optim::AdamW& optimizer, const model::NamedParams& params,
                       const std::string& source) {
  const auto names = names_of(params);
  auto& groups = optimizer.param_groups();
  MMSP_CHECK(groups.size() == state.groups.size(), source, ": the optimizer has ", groups.size(),
             " parameter groups but the checkpoint has ", state.groups.size());
  // Check everything, building the new state aside.
  std::set<std::string> optimised;
  std::vector<std::pair<compat::OptimizerStateKey, std::unique_ptr<torch::optim::AdamWParamState>>> fresh;
  for (size_t g = 0; g < groups.size(); ++g) {
    const AdamWGroupState& saved = state.groups[g];
    std::vector<std::string> here;
    for (const at::Tensor& p : groups[g].params()) {
      auto name = names.find(p.unsafeGetTensorImpl());
      MMSP_CHECK(name != names.end(), source, ": a parameter of optimizer group ", g, " (shape ", p.sizes(),
                 ") is not a parameter of the model");
      here.push_back(name->second);
    }
    MMSP_CHECK(here == saved.params, source, ": optimizer group ", g, " holds ", join(here),
               " but the checkpoint's holds ", join(saved.params),
               " (another model, or parameters grouped differently)");
    for (size_t i = 0; i < here.size(); ++i) {
      const std::string& name = here[i];
      optimised.insert(name);
      auto it = state.params.find(name);
      if (it == state.params.end()) continue;
      const AdamWParamMoments& m = it->second;
      const at::Tensor& p = groups[g].params()[i];
      MMSP_CHECK(m.step >= 1, source, ": parameter ", name, " has step count ", m.step,
                 "; a stored state has taken at least one step");
      MMSP_CHECK(saved.amsgrad == m.max_exp_avg_sq.defined(), source, ": parameter ", name,
                 saved.amsgrad ? " lacks max_exp_avg_sq, which amsgrad needs"
                               : " has max_exp_avg_sq but its group does not use amsgrad");
      auto s = std::make_unique<torch::optim::AdamWParamState>();
      s->step(m.step);
      const at::Tensor* moments[] = {&m.exp_avg, &m.exp_avg_sq, &m.max_exp_avg_sq};
      for (int k = 0; k < 3; ++k) {
        const at::Tensor& t = *moments[k];
        if (!t.defined()) continue;
        MMSP_CHECK(t.sizes() == p.sizes(), source, ": ", name, ".", kMoments[k], " has shape ", t.sizes(),
                   " but the parameter has ", p.sizes());
        at::Tensor copy = t.to(p.device(), p.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
        if (k == 0) s->exp_avg(copy);
        if (k == 1) s->exp_avg_sq(copy);
        if (k == 2) s->max_exp_avg_sq(copy);
      }
      fresh.emplace_back(compat::optimizer_state_key(p), std::move(s));
    }
  }
  for (const auto& [name, m] : state.params)
    MMSP_CHECK(optimised.count(name), source, ": the checkpoint has optimizer state for ", name,
               ", which this optimizer does not hold");
  // Then change.
  optimizer.state().clear();
  for (auto& [key, s] : fresh) optimizer.state()[key] = std::move(s);
  for (size_t g = 0; g < groups.size(); ++g) {
    auto& o = dynamic_cast<torch::optim::AdamWOptions&>(groups[g].options());
    const AdamWGroupState& saved = state.groups[g];
    o.lr(saved.lr).betas({saved.betas.first, saved.betas.second}).eps(saved.eps);
    o.weight_decay(saved.weight_decay).amsgrad(saved.amsgrad);
  }
}

std::map<std::string, at::Tensor> adamw_state_tensors(const AdamWState& state) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, m] : state.params) {
    out[name + ".exp_avg"] = m.exp_avg;
    out[name + ".exp_avg_sq"] = m.exp_avg_sq;
    if (m.max_exp_avg_sq.defined()) out[name + ".max_exp_avg_sq"] = m.max_exp_avg_sq;
  }
  return out;
}

std::map<std::string, std::string> adamw_state_metadata(const AdamWState& state) {
  json groups = json::array(), steps = json::object();
  for (const AdamWGroupState& g : state.groups)
    groups.push_back({{"lr", g.lr},
                      {"betas", {g.betas.first, g.betas.second}},
                      {"eps", g.eps},
                      {"weight_decay", g.weight_decay},
                      {"amsgrad", g.amsgrad},
                      {"params", g.params}});
  for (const auto& [name, m] : state.params) steps[name] = m.step;
  return {{"format", kFormat}, {kFormat, json{{"groups", groups}, {"steps", steps}}.dump()}};
}

AdamWState adamw_state_from(const std::map<std::string, at::Tensor>& tensors,
                            const std::map<std::string, std::string>& metadata, const std::string& source) {
  auto format = metadata.find("format");
  auto body = metadata.find(kFormat);
  MMSP_CHECK(format != metadata.end() && format->second == kFormat && body != metadata.end(), source,
             ": not an mmsp optimizer file (metadata \"format\" must be \"", kFormat, "\" with a \"", kFormat,
             "\" entry)");
  AdamWState out;
  try {
    const json j = parse_json_text(body->second, source + ": \"" + kFormat + "\" metadata");
    for (const json& g : j.at("groups")) {
      AdamWGroupState gs;
      gs.lr = g.at("lr").get<double>();
      gs.betas = {g.at("betas").at(0).get<double>(), g.at("betas").at(1).get<double>()};
      gs.eps = g.at("eps").get<double>();
      gs.weight_decay = g.at("weight_decay").get<double>();
      gs.amsgrad = g.at("amsgrad").get<bool>();
      gs.params = g.at("params").get<std::vector<std::string>>();
      out.groups.push_back(std::move(gs));
    }
    for (const auto& [name, step] : j.at("steps").items()) out.params[name].step = step.get<int64_t>();
  } catch (const json::exception& e) {
    throw Error(detail::concat(source, ": bad \"", kFormat, "\" metadata: ", e.what()));
  }
  for (const auto& [key, tensor] : tensors) {
    const size_t dot = key.rfind('.');
    const std::string name = dot == std::string::npos ? key : key.substr(0, dot);
    const std::string moment = dot == std::string::npos ? "" : key.substr(dot + 1);
    auto it = out.params.find(name);
    MMSP_CHECK(it != out.params.end(), source, ": tensor ", key,
               " belongs to no parameter listed in the metadata's steps");
    if (moment == kMoments[0])
      it->second.exp_avg = tensor;
    else if (moment == kMoments[1])
      it->second.exp_avg_sq = tensor;
    else if (moment == kMoments[2])
      it->second.max_exp_avg_sq = tensor;
    else
      MMSP_FAIL(source, ": tensor ", key, " is not exp_avg, exp_avg_sq or max_exp_avg_sq");
  }
  for (const auto& [name, m] : out.params) {
    MMSP_CHECK(m.exp_avg.defined() && m.exp_avg_sq.defined(), source, ": parameter ", name,
               " has a step count but lacks ", m.exp_avg.defined() ? "exp_avg_sq" : "exp_avg");
    MMSP_CHECK(m.exp_avg.sizes() == m.exp_avg_sq.sizes(), source, ": ", name, ".exp_avg has shape ", m.exp_avg.sizes(),
               " but ", name, ".exp_avg_sq has ", m.exp_avg_sq.sizes());
  }
  return out;
}

}  // namespace mmsp::train
