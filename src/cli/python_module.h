// The commands whose work is Python's (`mmsp prepare`: transformers' processors; `mmsp
// report`: matplotlib's plots) run `python -m mmsp.<module>` with the Python the build was
// configured with (MMSP_PYTHON; the environment variable of that name overrides it) and the
// package of the source tree (MMSP_PYTHONPATH overrides it), passing every argument through.
#pragma once

#include <string>
#include <vector>

namespace mmsp::cli {

// Replaces this process (execv); returns 2, having said why, only when it cannot.
// `needs`: what that Python must have, for the messages.
int exec_python_module(const std::string& command, const std::string& module, const std::vector<std::string>& args,
                       const std::string& needs);

}  // namespace mmsp::cli
