// The heavy, stable headers shared by every translation unit that touches tensors.
// Only what is used widely belongs here: narrow headers keep 2-core builds bearable.
#pragma once
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
