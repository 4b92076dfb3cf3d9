#pragma once

#include <cstdint>

#include "common/job.h"

namespace hydra {

/// The value spec.search.random gives `axis` in trial `index` (0-based) of a search seeded
/// with `seed`. A pure function of (seed, index, field name, distribution): the same manifest
/// draws the same trials in `hydra run` and in the controller, and adding or removing another
/// axis leaves this one's draws alone. Integer arithmetic (SplitMix64) picks the point; floats
/// are rounded to 6 significant digits (kept inside [low, high]), so a different libm's last
/// bit of log/exp does not change a trial.
ParamValue DrawValue(const RandomAxis& axis, int64_t seed, int64_t index);

/// "uniform" | "logUniform" | "intUniform" | "choice".
const char* DistributionName(Distribution d);

}  // namespace hydra
