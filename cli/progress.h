#pragma once

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/local_runner.h"

namespace hydra::cli {

/// Live table on a terminal: one line per trial (state, progress bar, step, loss, validation
/// loss, tokens/s, ETA), redrawn in place at most `redraw_hz` times a second.
std::unique_ptr<ProgressSinkInterface> MakeTerminalProgress(FILE* out, double redraw_hz = 5);

/// Plain log lines for pipes and files: trial start, every `every_fraction` of the steps,
/// every evaluation, and the end, each with a timestamp since the job started.
std::unique_ptr<ProgressSinkInterface> MakeLogProgress(FILE* out, double every_fraction = 0.1);

/// Reports nothing but messages.
std::unique_ptr<ProgressSinkInterface> MakeQuietProgress(FILE* out);

}  // namespace hydra::cli
