#include "common/partitioner.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <sstream>

#include "common/units.h"

namespace hydra {
namespace {

struct LayerNeed {
  int64_t params = 0;  // movable (not tied)
  int64_t state = 0;   // what moves to the device: weights (+ optimizer state stepped there)
  int64_t moved = 0;   // what moves between the tiers: weights + optimizer state
  int64_t grad = 0;
  int64_t act = 0;  // autograd activations of one micro-batch
  int64_t out = 0;  // output bytes of one micro-batch
  double flops = 0;
  double step_flops = 0;  // forward, backward and what the plan recomputes of it, per micro-batch
};

/// One field of layers a..b summed: `ShardSum(l, a, b, &LayerNeed::state)`.
template <typename T>
T ShardSum(const std::vector<LayerNeed>& l, int a, int b, T LayerNeed::*field) {
  T sum = 0;
  for (int i = a; i <= b; ++i) sum += l[i].*field;
  return sum;
}

/// The most device bytes layers a..b's activations (one micro-batch's) and gradients take at
/// once. The backward runs b..a, and autograd frees what a layer saved once its backward has
/// run: while layer j's runs, the layers before it keep their activations and the layers after
/// it have their gradients, so with one micro-batch the peak is the largest act[a..j] +
/// grad[j..b], not act + grad (GPT-2 medium in bf16 on an H200: the allocator's peak was 1.17
/// GiB under that sum, its gradients 1.32 GiB). With more micro-batches every gradient exists
/// from the first one's backward on while the next recomputes all its activations: act + grad.
int64_t LiveBytes(const std::vector<LayerNeed>& l, int a, int b, int64_t micro_batches) {
  const int64_t act = ShardSum(l, a, b, &LayerNeed::act);
  if (micro_batches > 1) return act + ShardSum(l, a, b, &LayerNeed::grad);
  int64_t live = 0, before = act, after = 0;  // act[a..j], grad[j..b]
  for (int j = b; j >= a; --j) {
    after += l[j].grad;
    live = std::max(live, before + after);
    before -= l[j].act;
  }
  return live;
}

/// Boundary activations of layers a..b: their input and output for every micro-batch.
int64_t BoundaryBytes(const std::vector<LayerNeed>& l, int a, int b, int64_t micro_batches) {
  return (l[b].out + (a > 0 ? l[a - 1].out : 0)) * micro_batches;
}

int64_t ShardNeed(const std::vector<LayerNeed>& l, int a, int b, int64_t micro_batches) {
  return ShardSum(l, a, b, &LayerNeed::state) + LiveBytes(l, a, b, micro_batches) +
         BoundaryBytes(l, a, b, micro_batches);
}

/// What layers a..b's activations and gradients take less at their peak than both at once
/// (LiveBytes): ShardPlan::backward_freed_bytes.
int64_t FreedBytes(const std::vector<LayerNeed>& l, int a, int b, int64_t micro_batches) {
  return ShardSum(l, a, b, &LayerNeed::act) + ShardSum(l, a, b, &LayerNeed::grad) -
         LiveBytes(l, a, b, micro_batches);
}

/// Greedy contiguous packing with each shard's need capped at `cap`, from the last layer back:
/// the last shard, which runs its forward and backward at once and never recomputes, gets as
/// many layers as the cap allows. Empty if a layer exceeds the cap.
std::vector<int> Pack(const std::vector<LayerNeed>& l, int64_t cap, int64_t mb) {
  const int n = static_cast<int>(l.size());
  std::vector<int> starts;  // back to front, then reversed
  int end = n - 1;
  for (int i = n - 2; i >= 0; --i) {
    if (ShardNeed(l, i, end, mb) > cap) {
      starts.push_back(i + 1);
      end = i;
    }
  }
  starts.push_back(0);
  std::reverse(starts.begin(), starts.end());
  for (size_t s = 0; s < starts.size(); ++s) {
    const int end = s + 1 < starts.size() ? starts[s + 1] - 1 : n - 1;
    if (ShardNeed(l, starts[s], end, mb) > cap) return {};
  }
  return starts;
}

/// The last layer of shard s of a packing.
int ShardEnd(const std::vector<LayerNeed>& l, const std::vector<int>& starts, size_t s) {
  return s + 1 < starts.size() ? starts[s + 1] - 1 : static_cast<int>(l.size()) - 1;
}

/// How a packing's shards keep their activations for the backward (the last shard runs its
/// forward and backward at once: kStash), and the device bytes that follow from it.
struct ActivationChoice {
  std::vector<ActivationPolicy> policy;
  std::vector<int64_t> stash;    ///< graphs kept on the device to the backward (all micro-batches)
  std::vector<int64_t> off;      ///< graphs offloaded to the host (all micro-batches)
  std::vector<int64_t> pending;  ///< per shard: offloaded graphs on the device during its work
  bool drains = true;            ///< every copy out ends before the first backward begins
  double recomputed_flops = 0;   ///< forward FLOPs per micro-batch the backward repeats
  double stall_seconds = 0;      ///< backward time the offloaded graphs' copies in add
  /// Per shard: its state stays on the device across steps (ShardPlan::resident). Not a
  /// choice of ChooseActivations: it is given, the last shards of the packing.
  std::vector<char> resident;
  /// Recomputing shards after recomputing shards keep their inputs in host memory
  /// (PartitionOptions::checkpoint_offload; InputOffloaded). Given, as `resident` is.
  bool inputs_offloaded = false;

  /// Whether shard s's input waits in host memory until its backward: it recomputes, and so
  /// does the shard before it (whose output it is: no graph of that shard holds it); and it is
  /// not the shard before the last, whose backward follows the last shard's forward and
  /// backward at once: its input would come back as it left, the last shard's task counting
  /// it twice (copying out and in), for nothing.
  bool InputOffloaded(size_t s) const {
    return inputs_offloaded && s > 0 && s + 2 < policy.size() &&
           policy[s] == ActivationPolicy::kRecompute &&
           policy[s - 1] == ActivationPolicy::kRecompute;
  }

  /// Every shard but the last recomputes; the last `residents` shards stay on the device.
  static ActivationChoice Recompute(size_t shards, size_t residents = 0,
                                    bool inputs_offloaded = false) {
    ActivationChoice c;
    c.inputs_offloaded = inputs_offloaded;
    c.policy.assign(shards, ActivationPolicy::kRecompute);
    c.policy.back() = ActivationPolicy::kStash;
    c.stash.assign(shards, 0);
    c.off.assign(shards, 0);
    c.pending.assign(shards, 0);
    c.resident.assign(shards, 0);
    for (size_t s = shards - std::min(residents, shards); s < shards; ++s) c.resident[s] = 1;
    return c;
  }
};

/// Bytes of the input shard s keeps for its backward (every micro-batch's); 0 for the first.
int64_t InputBytes(const std::vector<LayerNeed>& l, const std::vector<int>& starts, size_t s,
                   int64_t mb) {
  return starts[s] > 0 ? l[starts[s] - 1].out * mb : 0;
}

/// Device bytes of the resident shards' state while shard s works, but for s and its
/// neighbours' (which PackPeak counts anyway).
int64_t ResidentBesides(const std::vector<LayerNeed>& l, const std::vector<int>& starts, size_t s,
                        const ActivationChoice* choice) {
  int64_t bytes = 0;
  for (size_t r = 0; choice && r < starts.size(); ++r) {
    if (!choice->resident[r] || (r + 1 >= s && r <= s + 1)) continue;
    bytes += ShardSum(l, starts[r], ShardEnd(l, starts, r), &LayerNeed::state);
  }
  return bytes;
}

/// Peak device bytes of a packing: a shard's need plus the next shard's prefetched state, and
/// the inputs the shards before it keep for their backward; with a choice, also the graphs the
/// shards before it keep on the device (ActivationChoice::stash), a stashing or offloading
/// shard's graphs of every micro-batch at once, the offloaded graphs still on the device
/// while the shard works (ActivationChoice::pending), and the resident shards' state.
int64_t PackPeak(const std::vector<LayerNeed>& l, const std::vector<int>& starts, int64_t mb,
                 const ActivationChoice* choice = nullptr) {
  int64_t peak = 0;
  int64_t kept = 0;  // inputs and graphs the shards before this one keep on the device
  for (size_t s = 0; s < starts.size(); ++s) {
    const int end = ShardEnd(l, starts, s);
    int64_t need = ShardNeed(l, starts[s], end, mb);
    // In backward the previous shard is being prefetched while the next one is still being
    // written back: both neighbours' state may be in memory at once.
    int64_t neighbour = 0;
    if (s + 1 < starts.size())
      neighbour += ShardSum(l, starts[s + 1], ShardEnd(l, starts, s + 1), &LayerNeed::state);
    if (s > 0) neighbour += ShardSum(l, starts[s - 1], starts[s] - 1, &LayerNeed::state);
    // A stashing (or offloading) shard's forward keeps every micro-batch's graph, not one at a
    // time.
    const int64_t graphs = choice ? choice->stash[s] + choice->off[s] : 0;
    const int64_t own = graphs == 0 ? 0 : graphs - ShardSum(l, starts[s], end, &LayerNeed::act);
    // The input of the shard before, offloaded: copying out beside this shard's forward, and
    // coming back beside its backward.
    const int64_t pending =
        (choice ? choice->pending[s] : 0) +
        (choice && s > 0 && choice->InputOffloaded(s - 1) ? InputBytes(l, starts, s - 1, mb) : 0);
    peak = std::max(
        peak, need + neighbour + kept + own + pending + ResidentBesides(l, starts, s, choice));
    kept += (choice && choice->InputOffloaded(s) ? 0 : InputBytes(l, starts, s, mb)) +
            (choice ? choice->stash[s] : 0);
  }
  return peak;
}

/// Seconds of shard s's forward over every micro-batch at `flops_per_second`.
double ForwardSeconds(const std::vector<LayerNeed>& l, const std::vector<int>& starts, size_t s,
                      int64_t mb, double flops_per_second) {
  return ShardSum(l, starts[s], ShardEnd(l, starts, s), &LayerNeed::flops) *
         static_cast<double>(mb) / flops_per_second;
}

/// Fills the derived fields of `c` from its policies: bytes kept and offloaded, the offloaded
/// graphs on the device during each shard's work, whether the copies out drain before the
/// first backward, the FLOPs recomputed and the copies in's stall. The copies out queue on the
/// write-back stream as the forwards run (a shard's starts when its forward ends and the copy
/// before it is done), and its device memory is freed when its copy ends; a shard's copy in
/// runs beside the backward of the shard after it, with that shard's weights (state) coming up.
void Derive(const std::vector<LayerNeed>& l, const std::vector<int>& starts, int64_t mb,
            const PartitionOptions& o, ActivationChoice* c) {
  const size_t S = starts.size();
  const double link = o.host_link_bytes_per_second;
  std::vector<double> begins(S), fwd(S), copy_end(S, 0);
  double t = 0, queue = 0;
  c->recomputed_flops = 0;
  for (size_t s = 0; s < S; ++s) {
    const int end = ShardEnd(l, starts, s);
    const int64_t act = ShardSum(l, starts[s], end, &LayerNeed::act) * mb;
    c->stash[s] = c->policy[s] == ActivationPolicy::kStash && s + 1 < S ? act : 0;
    c->off[s] = c->policy[s] == ActivationPolicy::kOffload ? act : 0;
    if (c->policy[s] == ActivationPolicy::kRecompute)
      c->recomputed_flops += ShardSum(l, starts[s], end, &LayerNeed::flops);
    fwd[s] = ForwardSeconds(l, starts, s, mb, o.flops_per_second);
    begins[s] = t;
    t += s + 1 < S ? fwd[s] : 3 * fwd[s];  // the last shard: its forward and backward
    if (c->off[s] > 0) {
      queue = std::max(queue, t) + static_cast<double>(c->off[s]) / link;
      copy_end[s] = queue;
    }
  }
  c->drains = queue <= t;
  c->stall_seconds = 0;
  for (size_t s = 0; s < S; ++s) {
    int64_t copying = 0;  // copies out not done when shard s begins
    for (size_t r = 0; r < s; ++r) copying += copy_end[r] > begins[s] ? c->off[r] : 0;
    const int64_t refill = s > 0 ? c->off[s - 1] : 0;  // in beside s's backward
    c->pending[s] = s + 1 < S ? std::max(copying, refill) : copying + refill;
    if (refill == 0) continue;  // so s > 0
    const double up =
        static_cast<double>(ShardSum(l, starts[s - 1], starts[s] - 1, &LayerNeed::state));
    const double backward =
        (s + 1 < S ? 2 : 3) * fwd[s] + (c->policy[s] == ActivationPolicy::kRecompute ? fwd[s] : 0);
    c->stall_seconds += std::max(0.0, (up + static_cast<double>(refill)) / link - backward) -
                        std::max(0.0, up / link - backward);
  }
}

/// The step time a choice adds beyond the packing's forwards and backwards, in FLOPs at
/// `flops_per_second`: what the backward recomputes and what the copies in stall.
double ChoiceCost(const ActivationChoice& c, int64_t mb, double flops_per_second) {
  return c.recomputed_flops * static_cast<double>(mb) + c.stall_seconds * flops_per_second;
}

/// Bytes a step moves over the host link with choice `c` (PartitionOptions::resident_state):
/// every shard not resident brings its state (weights and optimizer state) up for its backward
/// and sends it back after its step, and a shard between the first and the last also brings
/// its weights up for its forward (the first stays on the device from the step before, the
/// last runs both at once); an offloaded graph, or input, goes out and comes back.
double LinkBytes(const std::vector<LayerNeed>& l, const std::vector<int>& starts,
                 const ActivationChoice& c, int64_t mb) {
  const size_t S = starts.size();
  double bytes = 0;
  for (size_t s = 0; s < S; ++s) {
    const int end = ShardEnd(l, starts, s);
    bytes += 2.0 * static_cast<double>(c.off[s]);
    if (c.InputOffloaded(s)) bytes += 2.0 * static_cast<double>(InputBytes(l, starts, s, mb));
    if (c.resident[s]) continue;
    bytes += 2.0 * static_cast<double>(ShardSum(l, starts[s], end, &LayerNeed::moved));
    if (s > 0 && s + 1 < S)
      bytes += 4.0 * static_cast<double>(ShardSum(l, starts[s], end, &LayerNeed::params));
  }
  return bytes;
}

/// The step a packing with choice `c` takes, in FLOPs at o.flops_per_second: its compute
/// (`base_flops`, the forwards and backwards of every layer, with what `c` recomputes and
/// stalls and kShardOverheadSeconds a shard), or with o.resident_state the time its copies
/// take (LinkBytes over the host link) where that is longer.
double StepCost(const std::vector<LayerNeed>& l, const std::vector<int>& starts, int64_t mb,
                const ActivationChoice& c, double base_flops, const PartitionOptions& o) {
  const double compute =
      base_flops + ChoiceCost(c, mb, o.flops_per_second) +
      kShardOverheadSeconds * o.flops_per_second * static_cast<double>(starts.size());
  if (!o.resident_state || o.host_link_bytes_per_second <= 0) return compute;
  return std::max(compute,
                  LinkBytes(l, starts, c, mb) / o.host_link_bytes_per_second * o.flops_per_second);
}

/// Sets shards `candidates` (in their order) to `to` one at a time where the packing still
/// fits `usable` and, for kOffload, its copies out drain before the backward.
void Greedy(const std::vector<LayerNeed>& l, const std::vector<int>& starts, int64_t mb,
            int64_t usable, const PartitionOptions& o, const std::vector<size_t>& candidates,
            ActivationPolicy to, ActivationChoice* c) {
  for (size_t s : candidates) {
    if (c->policy[s] != ActivationPolicy::kRecompute) continue;
    c->policy[s] = to;
    Derive(l, starts, mb, o, c);
    if (!c->drains || PackPeak(l, starts, mb, c) > usable) {
      c->policy[s] = ActivationPolicy::kRecompute;
      Derive(l, starts, mb, o, c);
    }
  }
}

/// The forwards and backwards of every layer over the micro-batches, in FLOPs: the compute
/// every packing of the layers does before what it recomputes.
double StepFlops(const std::vector<LayerNeed>& l, int64_t mb) {
  double flops = 0;
  for (const auto& n : l) flops += n.step_flops;
  return flops * static_cast<double>(mb);
}

/// `o` with the link left out of StepCost.
PartitionOptions WithoutLink(PartitionOptions o) {
  o.resident_state = false;
  return o;
}

/// The numbers of resident shards PackForDeviceStash tries for a packing of `shards`: none,
/// or with o.resident_state from none up to all of them (in steps of shards / 16: at most 32
/// counts).
std::vector<size_t> ResidentCounts(size_t shards, const PartitionOptions& o) {
  std::vector<size_t> counts = {0};
  if (!o.resident_state || o.host_link_bytes_per_second <= 0) return counts;
  const size_t step = std::max<size_t>(1, shards / 16);
  for (size_t m = step; m < shards; m += step) counts.push_back(m);
  counts.push_back(shards);
  return counts;
}

/// Stashing on the device (PartitionOptions::stash_on_device): which shards of a packing keep
/// their forward's graph on the device, chosen greedily by the forward FLOPs each saves per
/// byte it keeps, and (PartitionOptions::activation_offload) which offload it, from the first
/// shard on (its copy has the longest to run), while the packing's peak fits `usable` (bytes;
/// no budget: the largest int64); the rest recompute. Offloading first and stashing first are
/// both tried; the one whose step costs least wins.
ActivationChoice ChooseActivations(const std::vector<LayerNeed>& l, const std::vector<int>& starts,
                                   int64_t mb, int64_t usable, const PartitionOptions& o,
                                   size_t residents = 0) {
  const size_t S = starts.size();
  std::vector<size_t> by_value, in_order;
  for (size_t s = 0; s + 1 < S; ++s) in_order.push_back(s);
  by_value = in_order;
  auto per_byte = [&](size_t s) {
    const int end = ShardEnd(l, starts, s);
    return ShardSum(l, starts[s], end, &LayerNeed::flops) /
           static_cast<double>(1 + ShardSum(l, starts[s], end, &LayerNeed::act));
  };
  std::stable_sort(by_value.begin(), by_value.end(),
                   [&](size_t a, size_t b) { return per_byte(a) > per_byte(b); });
  ActivationChoice stash_first = ActivationChoice::Recompute(S, residents, o.checkpoint_offload);
  Derive(l, starts, mb, o, &stash_first);
  Greedy(l, starts, mb, usable, o, by_value, ActivationPolicy::kStash, &stash_first);
  const bool offload = o.activation_offload && o.host_link_bytes_per_second > 0;
  if (!offload) return stash_first;
  // Where the link bounds the step, an offloaded graph's copies may cost more than the
  // recompute they save.
  const ActivationChoice stash_only = stash_first;
  Greedy(l, starts, mb, usable, o, in_order, ActivationPolicy::kOffload, &stash_first);
  ActivationChoice offload_first = ActivationChoice::Recompute(S, residents, o.checkpoint_offload);
  Derive(l, starts, mb, o, &offload_first);
  Greedy(l, starts, mb, usable, o, in_order, ActivationPolicy::kOffload, &offload_first);
  Greedy(l, starts, mb, usable, o, by_value, ActivationPolicy::kStash, &offload_first);
  const double base = StepFlops(l, mb);
  auto cost = [&](const ActivationChoice& c) { return StepCost(l, starts, mb, c, base, o); };
  const ActivationChoice& best =
      cost(offload_first) < cost(stash_first) ? offload_first : stash_first;
  return o.resident_state && cost(stash_only) < cost(best) ? stash_only : best;
}

/// What PackForDeviceStash chose: the first layer of each shard, and how many of the last
/// shards keep their state on the device (PartitionOptions::resident_state).
struct Packing {
  std::vector<int> starts;
  size_t residents = 0;
};

/// Stashing on the device: of every packing under `usable` (from the fewest shards), and with
/// o.resident_state of every number of its last shards kept resident, the one whose step costs
/// least (StepCost): the forward FLOPs its backward recomputes once its activations are chosen
/// (ChooseActivations), the copies in's stall, kShardOverheadSeconds a shard, and the copies
/// of the state that is not resident where the link takes longer than that compute. Empty
/// starts if none fits.
Packing PackForDeviceStash(const std::vector<LayerNeed>& l, int64_t usable, int64_t mb,
                           const PartitionOptions& o) {
  Packing best;
  double cheapest = 0;
  const double base = StepFlops(l, mb);
  // Tries packing p; true where more shards can only cost more.
  auto try_packing = [&](const std::vector<int>& p) {
    bool free = false;  // the last choice tried: nothing recomputed, stalled or waited for
    for (size_t m : ResidentCounts(p.size(), o)) {
      const ActivationChoice fits = ActivationChoice::Recompute(p.size(), m, o.checkpoint_offload);
      if (PackPeak(l, p, mb, &fits) > usable) break;  // nor does any larger m
      const ActivationChoice c = ChooseActivations(l, p, mb, usable, o, m);
      const double cost = StepCost(l, p, mb, c, base, o);
      if (best.starts.empty() || cost < cheapest) {
        best = {p, m};
        cheapest = cost;
      }
      // Bound by its compute, not the link: more resident shards only take memory.
      const bool compute_bound = cost <= StepCost(l, p, mb, c, base, WithoutLink(o));
      free = compute_bound && ChoiceCost(c, mb, o.flops_per_second) == 0;
      if (compute_bound) break;
    }
    return free;
  };
  std::vector<int> last;
  for (int64_t cap = usable; cap > 0; cap = cap * 15 / 16) {
    auto p = Pack(l, cap, mb);
    if (p.empty()) break;  // a layer alone passes the cap: so it does every smaller one
    if (p == last) continue;
    last = p;
    if (try_packing(p)) return best;
  }
  // The caps skip past a layer a shard where two small layers share a shard under the cap of
  // the largest: with offloaded inputs that packing may be the only one that fits.
  std::vector<int> per_layer(l.size());
  for (size_t i = 0; i < l.size(); ++i) per_layer[i] = static_cast<int>(i);
  if (best.starts.empty() && o.checkpoint_offload && per_layer != last) try_packing(per_layer);
  return best;
}

/// Seconds shard work of `compute_seconds` takes per step with its optimizer `where`, per the
/// measured rates: the weights go up and their gradients (or, stepped on the host, the new
/// weights at the next fetch) come down either way; on the device the optimizer state goes up
/// and down too, on the copy streams beside the shard's compute; on the host the fused
/// optimizer streams weights, gradients and state (12 + 2 x state bytes a parameter) after the
/// backward, with nothing to hide behind.
double OptimizerStepSeconds(OptimizerPlacement where, double compute_seconds, double parameters,
                            double state_per_parameter, const PartitionOptions& o) {
  const bool device = where == OptimizerPlacement::kDevice;
  const double link = (8.0 + (device ? 2.0 * state_per_parameter : 0.0)) * parameters /
                      o.host_link_bytes_per_second;
  const double host =
      device ? 0.0
             : (12.0 + 2.0 * state_per_parameter) * parameters / o.host_optimizer_bytes_per_second;
  return std::max(compute_seconds, link) + host;
}

}  // namespace

const char* ActivationPolicyName(ActivationPolicy p) {
  switch (p) {
    case ActivationPolicy::kStash: return "stash";
    case ActivationPolicy::kRecompute: return "recompute";
    case ActivationPolicy::kOffload: return "offload";
  }
  return "?";
}

const char* OptimizerPlacementName(OptimizerPlacement p) {
  return p == OptimizerPlacement::kDevice ? "device" : "host";
}

StatusOr<std::optional<OptimizerPlacement>> ParseOptimizerFlag(const std::string& value) {
  if (value == "auto") return std::optional<OptimizerPlacement>();
  if (value == "device") return std::optional(OptimizerPlacement::kDevice);
  if (value == "host") return std::optional(OptimizerPlacement::kHost);
  return InvalidArgumentError("--optimizer: \"" + value + "\" is not auto, device or host");
}

void ApplyOptimizerFlag(std::optional<OptimizerPlacement> flag, PartitionOptions* options) {
  if (options->state_tier == StateTier::kHost) options->optimizer_placement = flag;
}

OptimizerPlacement ChooseOptimizerPlacement(const Trial& trial, const PartitionOptions& o) {
  if (o.state_tier == StateTier::kDisk) return OptimizerPlacement::kDevice;
  if (o.optimizer_placement) return *o.optimizer_placement;
  if (o.host_link_bytes_per_second <= 0 || o.host_optimizer_bytes_per_second <= 0) {
    return OptimizerPlacement::kDevice;
  }
  // Per parameter, with no compute to hide copies behind.
  const double state = static_cast<double>(OptimizerBytesPerParameter(trial.training));
  return OptimizerStepSeconds(OptimizerPlacement::kHost, 0, 1, state, o) <
                 OptimizerStepSeconds(OptimizerPlacement::kDevice, 0, 1, state, o)
             ? OptimizerPlacement::kHost
             : OptimizerPlacement::kDevice;
}

PartitionOptions PartitionOptionsFor(const Trial& trial) {
  PartitionOptions po;
  po.device_budget = trial.resources.device_memory_budget.value_or(0);
  for (int64_t b : trial.resources.shard_boundaries) {
    po.explicit_boundaries.push_back(static_cast<int>(b));
  }
  po.state_tier =
      trial.resources.offload == OffloadTier::kDisk ? StateTier::kDisk : StateTier::kHost;
  po.micro_batches = trial.training.gradient_accumulation_steps;
  po.host_activation_budget = trial.resources.host_memory_budget.value_or(-1);
  return po;
}

namespace {

/// Where PlanFor places the optimizer: as the options say (ChooseOptimizerPlacement), or on the
/// host because with its state on the device no sharding fits (PlanShards' fallback; the
/// per-shard refinement still brings a shard's state onto the device where that is faster and
/// fits).
enum class Placing { kAsOptions, kHostToFit };

/// What PlanFor works from: each layer's needs on the device under one choice of attention
/// memory, recompute and optimizer placement, and what of the budget the shards may use.
struct PlanInputs {
  int64_t mb_count = 1;       // micro-batches a step
  int64_t micro = 0;          // sequences a micro-batch
  int64_t opt = 0;            // optimizer state bytes a parameter
  int64_t opt_on_device = 0;  // of those, what comes onto the device with a shard
  int n = 0;                  // layers
  AttentionMemory attention = AttentionMemory::kKept;
  bool selective = false;  // selective recompute
  OptimizerPlacement placement = OptimizerPlacement::kDevice;
  bool device_stash = false;  // graphs kept on the device (PartitionOptions::stash_on_device)
  PartitionOptions ro;        // the options with resident_state decided
  std::vector<LayerNeed> need;
  int64_t whole = 0;       // unsharded training's peak
  int64_t transient = 0;   // what one layer's backward allocates while it runs
  int64_t buffers = 0;     // the layers' buffers, on the device all along
  int64_t tied_bytes = 0;  // tied weights and their gradients, resident all step
  int64_t budget = 0;      // the device budget (<= 0: none)
  int64_t usable = 0;      // the budget left for the shards' own needs
};

PlanInputs LayerNeeds(const Trial& trial, const PartitionOptions& o,
                      const std::vector<LayerCost>& costs, AttentionMemory attention,
                      bool selective, OptimizerPlacement placement) {
  PlanInputs in;
  in.mb_count = std::max<int64_t>(1, o.micro_batches);
  in.micro = trial.training.batch_size / trial.training.gradient_accumulation_steps;
  in.opt = OptimizerBytesPerParameter(trial.training);
  in.n = static_cast<int>(costs.size());
  in.attention = attention;
  in.selective = selective;
  in.placement = placement;
  in.device_stash = o.stash_on_device && o.state_tier == StateTier::kHost;
  // Shards stay resident only where their state would otherwise cross the link every step and
  // their optimizer steps on the device.
  in.ro = o;
  in.ro.resident_state = o.resident_state && in.device_stash && o.host_link_bytes_per_second > 0 &&
                         placement == OptimizerPlacement::kDevice;
  in.opt_on_device = placement == OptimizerPlacement::kDevice ? in.opt : 0;
  const int64_t opt = in.opt, opt_on_device = in.opt_on_device;
  in.need.resize(in.n);
  int64_t tied = 0;
  for (int i = 0; i < in.n; ++i) {
    LayerNeed& need = in.need[i];
    in.transient = std::max(in.transient, BackwardTransientBytes(costs[i], attention, selective));
    in.buffers += costs[i].buffer_bytes;
    tied += costs[i].tied_parameters;
    need.params = costs[i].parameters - costs[i].tied_parameters;
    // Tied weights stay on the device, but their optimizer state moves with the shard.
    need.moved = need.params * (4 + opt) + costs[i].tied_parameters * opt;
    need.state = need.params * (4 + opt_on_device) + costs[i].tied_parameters * opt_on_device;
    need.grad = need.params * 4;
    need.act = KeptActivationBytes(costs[i], attention, selective);
    need.out = costs[i].output_bytes;
    need.flops = costs[i].forward_flops;
    need.step_flops = 3 * costs[i].forward_flops +
                      (attention == AttentionMemory::kRecomputed ? costs[i].attention_flops : 0) +
                      (selective ? costs[i].recompute_flops : 0);
    in.whole += costs[i].parameters * (4 + opt) + costs[i].tied_parameters * 4;
  }
  // Unsharded: the tied parameters' gradients all the backward (the head's comes first).
  in.whole += LiveBytes(in.need, 0, in.n - 1, in.mb_count) + in.transient + in.buffers;
  in.tied_bytes = tied * 8;  // weights and gradients
  in.budget = o.device_budget;
  in.usable = in.budget - in.tied_bytes - in.buffers - in.transient;
  return in;
}

/// RESOURCE_EXHAUSTED: layer i alone needs `single` bytes, more than the shards may use.
Status LayerTooLargeError(const PlanInputs& in, const std::vector<LayerCost>& costs, int i,
                          int64_t single) {
  const std::string held = FormatBytes(in.tied_bytes) + " of shared (tied) parameters" +
                           (in.buffers > 0 ? ", " + FormatBytes(in.buffers) + " of buffers" : "") +
                           (in.transient > 0 ? " and " + FormatBytes(in.transient) +
                                                   " that a layer's backward needs while it runs"
                                             : "");
  char buf[640];
  std::snprintf(buf, sizeof(buf),
                "layer %s needs %s on the device (%s %s, %s "
                "gradients, %s activations at micro-batch %lld) but the device budget of "
                "%s leaves %s after %s; raise "
                "spec.resources.deviceMemoryBudget or lower the batch size",
                costs[i].name.c_str(), FormatBytes(single).c_str(),
                FormatBytes(in.need[i].state).c_str(),
                in.opt_on_device > 0 ? "weights and optimizer state"
                                     : "weights, its optimizer stepping on the host",
                FormatBytes(in.need[i].grad).c_str(), FormatBytes(in.need[i].act).c_str(),
                static_cast<long long>(in.micro), FormatBytes(in.budget).c_str(),
                FormatBytes(std::max<int64_t>(0, in.usable)).c_str(), held.c_str());
  return ResourceExhaustedError(buf);
}

/// Where a plan cuts the layers: each shard's first layer, and how many of the last shards
/// stay resident.
struct Cut {
  std::vector<int> starts;
  size_t residents = 0;
  bool packed = false;  // cut to the budget (possibly into one shard, its optimizer on the host)
};

/// The manifest's shardBoundaries; one shard where the trial fits unsharded; otherwise the
/// fewest shards whose packing (with prefetch buffers) fits the budget.
StatusOr<Cut> CutIntoShards(const PlanInputs& in, const PartitionOptions& o,
                            const std::vector<LayerCost>& costs) {
  Cut cut;
  const int n = in.n;
  if (!o.explicit_boundaries.empty()) {
    cut.starts.push_back(0);
    for (int b : o.explicit_boundaries) {
      if (b <= cut.starts.back() || b >= n) {
        return InvalidArgumentError(
            "spec.resources.shardBoundaries: boundaries must be increasing layer indices in 1.." +
            std::to_string(n - 1) + ", got " + std::to_string(b));
      }
      cut.starts.push_back(b);
    }
    return cut;
  }
  if (in.budget <= 0 || (in.whole <= in.budget && o.state_tier == StateTier::kHost)) {
    cut.starts = {0};  // fits: plain training
    return cut;
  }
  cut.packed = true;
  for (int i = 0; i < n; ++i) {
    const int64_t single = ShardNeed(in.need, i, i, in.mb_count);
    if (single > in.usable) return LayerTooLargeError(in, costs, i, single);
  }
  // Largest per-shard cap whose packing (with prefetch buffers) fits: fewest shards.
  if (in.device_stash) {
    Packing packing = PackForDeviceStash(in.need, in.usable, in.mb_count, in.ro);
    cut.starts = std::move(packing.starts);
    cut.residents = packing.residents;
  }
  for (int64_t cap = in.usable; cut.starts.empty() && cap > 0; cap = cap * 15 / 16) {
    auto p = Pack(in.need, cap, in.mb_count);
    if (!p.empty() && PackPeak(in.need, p, in.mb_count) <= in.usable) {
      cut.starts = p;
      break;
    }
  }
  if (!cut.starts.empty()) return cut;
  // Fall back to one layer per shard if it fits with its neighbours.
  std::vector<int> all(n);
  for (int i = 0; i < n; ++i) all[i] = i;
  if (PackPeak(in.need, all, in.mb_count) > in.usable) {
    return ResourceExhaustedError(
        "no sharding fits the device budget of " + FormatBytes(in.budget) +
        " with a prefetch buffer; one layer per shard needs " +
        FormatBytes(PackPeak(in.need, all, in.mb_count) + in.tied_bytes + in.buffers +
                    in.transient) +
        (in.placement == OptimizerPlacement::kHost ? ", its optimizer stepping on the host" : ""));
  }
  cut.starts = all;
  return cut;
}

/// Shard s of the cut: its layers, bytes, FLOPs, activation policy, optimizer placement and
/// residency; what it offloads and keeps resident is added to `plan`.
ShardPlan DescribeShard(const PlanInputs& in, const PartitionOptions& o,
                        const std::vector<LayerCost>& costs, const std::vector<int>& starts,
                        size_t s, bool sharded, const ActivationChoice& choice,
                        PartitionPlan* plan) {
  const int64_t mb_count = in.mb_count;
  ShardPlan sp;
  sp.first_layer = starts[s];
  sp.last_layer = s + 1 < starts.size() ? starts[s + 1] - 1 : in.n - 1;
  sp.first_name = costs[sp.first_layer].name;
  sp.last_name = costs[sp.last_layer].name;
  for (int i = sp.first_layer; i <= sp.last_layer; ++i) {
    const int64_t p = sharded ? in.need[i].params : costs[i].parameters;
    sp.parameters += p;
    sp.state_bytes += sharded ? in.need[i].moved : p * (4 + in.opt);
    sp.gradient_bytes += p * 4;
    sp.activation_bytes += in.need[i].act;
    sp.forward_flops += in.need[i].flops;
    if (in.attention == AttentionMemory::kRecomputed)
      sp.attention_flops += costs[i].attention_flops;
    if (in.selective) sp.recompute_flops += costs[i].recompute_flops;
  }
  const double recompute_cost =
      sp.forward_flops * static_cast<double>(mb_count) / o.flops_per_second;
  const double stash_bytes = 2.0 * static_cast<double>(sp.activation_bytes * mb_count);
  const double stash_cost =
      o.host_link_bytes_per_second > 0 ? stash_bytes / o.host_link_bytes_per_second : 0.0;
  const bool last = s + 1 == starts.size();
  if (last || !sharded) {
    sp.policy = ActivationPolicy::kStash;
  } else if (in.device_stash) {
    sp.policy = choice.policy[s];
  } else {
    sp.policy =
        stash_cost <= recompute_cost ? ActivationPolicy::kStash : ActivationPolicy::kRecompute;
  }
  if (sp.policy == ActivationPolicy::kOffload) plan->offloaded_bytes += choice.off[s];
  sp.input_offloaded = sharded && choice.InputOffloaded(s);
  if (sp.input_offloaded) plan->offloaded_bytes += InputBytes(in.need, starts, s, mb_count);
  sp.optimizer = sharded ? in.placement : OptimizerPlacement::kDevice;
  sp.resident = sharded && choice.resident[s];
  if (sp.resident) plan->resident_bytes += sp.state_bytes;
  sp.workspace_bytes = sp.activation_bytes +
                       BoundaryBytes(in.need, sp.first_layer, sp.last_layer, mb_count) +
                       in.transient;
  sp.backward_freed_bytes = FreedBytes(in.need, sp.first_layer, sp.last_layer, mb_count);
  return sp;
}

/// Stashed activations live in the host tier until their backward; past the host budget the
/// shards with the most activations recompute instead. A stashed autograd graph also holds the
/// shard's weights (GEMMs save them for backward), so with the state on disk a stashed shard's
/// weights cannot leave memory until its backward.
void RecomputePastTheHostBudget(const PartitionOptions& o, int64_t mb_count, PartitionPlan* plan) {
  auto stash_bytes = [&](const ShardPlan& sp) {
    return sp.activation_bytes * mb_count +
           (o.state_tier == StateTier::kDisk ? sp.parameters * 4 : 0);
  };
  // A discrete device stashes in its own memory or not at all.
  const int64_t host_budget = o.stash_on_device ? 0 : o.host_activation_budget;
  if (host_budget < 0) return;
  auto& shards = plan->shards;
  int64_t stashed = 0;
  for (size_t s = 0; s + 1 < shards.size(); ++s) {
    if (shards[s].policy == ActivationPolicy::kStash) stashed += stash_bytes(shards[s]);
  }
  std::vector<size_t> order;
  for (size_t s = 0; s + 1 < shards.size(); ++s) order.push_back(s);
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return stash_bytes(shards[a]) > stash_bytes(shards[b]); });
  for (size_t s : order) {
    if (stashed <= host_budget) break;
    if (shards[s].policy != ActivationPolicy::kStash) continue;
    shards[s].policy = ActivationPolicy::kRecompute;
    stashed -= stash_bytes(shards[s]);
  }
}

/// Per shard, the optimizer steps where that shard's step is shorter. The trial-wide choice
/// leaves compute out; compute hides the optimizer state's copies on the copy streams but not
/// the host optimizer's time, so a shard with enough work per parameter steps on the device
/// even where the trial-wide choice is the host (never the other way round), or where the host
/// is where every shard's state had to go for the plan to fit. Its state comes onto the device
/// only if the plan still fits the budget (`in.need` then counts it).
void RefineOptimizerPlacement(PlanInputs& in, const PartitionOptions& o,
                              const std::vector<LayerCost>& costs, const std::vector<int>& starts,
                              const ActivationChoice* on_device, PartitionPlan* plan) {
  for (ShardPlan& sp : plan->shards) {
    double params = 0;  // with tied ones: their optimizer state moves with the shard
    for (int i = sp.first_layer; i <= sp.last_layer; ++i) params += costs[i].parameters;
    const double state = static_cast<double>(in.opt);
    if (OptimizerStepSeconds(OptimizerPlacement::kDevice, sp.estimated_seconds, params, state, o) >=
        OptimizerStepSeconds(OptimizerPlacement::kHost, sp.estimated_seconds, params, state, o)) {
      continue;
    }
    auto add_state = [&](int64_t per_parameter) {
      for (int i = sp.first_layer; i <= sp.last_layer; ++i) {
        in.need[i].state += per_parameter * costs[i].parameters;
      }
    };
    add_state(in.opt);
    if (in.budget > 0 && PackPeak(in.need, starts, in.mb_count, on_device) > in.usable) {
      add_state(-in.opt);
      continue;
    }
    sp.optimizer = OptimizerPlacement::kDevice;
  }
}

/// PlanShards for one choice of what attention layers keep (KeptActivationBytes); the largest
/// layer's BackwardTransientBytes is the transient of whichever layer runs its backward.
StatusOr<PartitionPlan> PlanFor(const Trial& trial, const PartitionOptions& o,
                                const std::vector<LayerCost>& costs, AttentionMemory attention,
                                bool selective, Placing placing) {
  if (o.state_tier == StateTier::kDisk && o.optimizer_placement == OptimizerPlacement::kHost) {
    return InvalidArgumentError(
        "the optimizer steps on the host only with the state in the host tier, not on disk");
  }
  const OptimizerPlacement placement = placing == Placing::kHostToFit
                                           ? OptimizerPlacement::kHost
                                           : ChooseOptimizerPlacement(trial, o);
  PlanInputs in = LayerNeeds(trial, o, costs, attention, selective, placement);
  PartitionPlan plan;
  plan.state_tier = o.state_tier;
  plan.attention = attention;
  plan.selective_recompute = selective;
  plan.stash_on_device = in.device_stash;
  plan.optimizer_on_host_to_fit = placing == Placing::kHostToFit;
  ASSIGN_OR_RETURN(const Cut cut, CutIntoShards(in, o, costs));
  const std::vector<int>& starts = cut.starts;
  const bool sharded = starts.size() > 1 || cut.packed || o.state_tier == StateTier::kDisk;
  plan.pinned_bytes = sharded ? in.tied_bytes : 0;
  plan.buffer_bytes = in.buffers;
  const ActivationChoice choice =
      in.device_stash
          ? ChooseActivations(in.need, starts, in.mb_count,
                              in.budget > 0 ? in.usable : std::numeric_limits<int64_t>::max(),
                              in.ro, cut.residents)
          : ActivationChoice::Recompute(starts.size());
  const ActivationChoice* on_device = in.device_stash ? &choice : nullptr;
  for (size_t s = 0; s < starts.size(); ++s) {
    plan.shards.push_back(DescribeShard(in, o, costs, starts, s, sharded, choice, &plan));
    plan.total_state_bytes += plan.shards.back().state_bytes;
  }
  plan.total_state_bytes += plan.pinned_bytes / 2;  // the tied weights (not their gradients)
  if (sharded && !in.device_stash) RecomputePastTheHostBudget(o, in.mb_count, &plan);
  for (auto& sp : plan.shards) {
    const double fwd = sp.forward_flops * static_cast<double>(in.mb_count) / o.flops_per_second;
    sp.estimated_seconds = 3.0 * fwd + (sp.policy == ActivationPolicy::kRecompute ? fwd : 0.0) +
                           (sp.attention_flops + sp.recompute_flops) *
                               static_cast<double>(in.mb_count) / o.flops_per_second;
  }
  // The offloaded graphs' copies in where the backward beside them cannot hide them.
  if (in.device_stash && sharded) plan.shards.back().estimated_seconds += choice.stall_seconds;
  if (sharded && placement == OptimizerPlacement::kHost && !o.optimizer_placement &&
      o.host_link_bytes_per_second > 0 && o.host_optimizer_bytes_per_second > 0) {
    RefineOptimizerPlacement(in, o, costs, starts, on_device, &plan);
  }
  if (in.ro.resident_state && sharded) {
    plan.link_seconds =
        LinkBytes(in.need, starts, choice, in.mb_count) / o.host_link_bytes_per_second;
  }
  // After the optimizer's placement, which weighs compute alone against the copies.
  for (auto& sp : plan.shards) sp.estimated_seconds += sharded ? kShardOverheadSeconds : 0.0;
  plan.peak_device_bytes = sharded ? PackPeak(in.need, starts, in.mb_count, on_device) +
                                         plan.pinned_bytes + in.buffers + in.transient
                                   : in.whole;
  return plan;
}

}  // namespace

double EstimatedStepSeconds(const PartitionPlan& plan) {
  double s = 0;
  for (const auto& sp : plan.shards) s += sp.estimated_seconds;
  return std::max(s, plan.link_seconds);
}

namespace {

/// Of two plans of a trial, `lean` (more work a step, less kept) where its estimated step is
/// shorter or `plain` does not fit; otherwise `plain`.
StatusOr<PartitionPlan> Faster(StatusOr<PartitionPlan> plain, StatusOr<PartitionPlan> lean) {
  if (!lean.ok()) return plain;
  if (!plain.ok() || EstimatedStepSeconds(*lean) < EstimatedStepSeconds(*plain)) return lean;
  return plain;
}

/// PlanShards with the optimizer placed as `placing` says.
StatusOr<PartitionPlan> PlanPlaced(const Trial& trial, const PartitionOptions& o, Placing placing) {
  const int64_t micro = trial.training.batch_size / trial.training.gradient_accumulation_steps;
  const auto costs = ModelLayerCosts(trial, micro);
  if (costs.empty()) {
    return FailedPreconditionError("the layers of " + trial.model.path +
                                   " are not known before the module is loaded");
  }
  const bool has_attention = std::any_of(costs.begin(), costs.end(),
                                         [](const LayerCost& c) { return c.attention_bytes > 0; });
  const bool may_choose = o.explicit_boundaries.empty() && o.device_budget > 0;
  // Selective recompute costs elementwise work in backward and frees a third of a block's
  // activations: it pays where that saves shards, recompute or copies (the estimated step
  // decides), or where the trial fits no other way.
  const bool has_recomputable = std::any_of(
      costs.begin(), costs.end(), [](const LayerCost& c) { return c.recomputable_bytes > 0; });
  auto with_selective = [&](const PartitionOptions& po,
                            AttentionMemory attention) -> StatusOr<PartitionPlan> {
    auto plain = PlanFor(trial, po, costs, attention, false, placing);
    if (!o.selective_recompute || !has_recomputable || !may_choose) return plain;
    return Faster(std::move(plain), PlanFor(trial, po, costs, attention, true, placing));
  };
  // Offloaded inputs cost the link's time and free the device's memory: planned with and
  // without, where the plan may stash on the device.
  auto plan_for = [&](AttentionMemory attention) -> StatusOr<PartitionPlan> {
    PartitionOptions kept_inputs = o;
    kept_inputs.checkpoint_offload = false;
    auto kept = with_selective(kept_inputs, attention);
    const bool offload_inputs = o.checkpoint_offload && o.stash_on_device &&
                                o.state_tier == StateTier::kHost &&
                                o.host_link_bytes_per_second > 0 && may_choose;
    if (!offload_inputs) return kept;
    return Faster(std::move(kept), with_selective(o, attention));
  };
  // A fused kernel keeps no scores and recomputes nothing: nothing to choose.
  if (o.fused_attention && has_attention) return plan_for(AttentionMemory::kFused);
  auto kept = plan_for(AttentionMemory::kKept);
  if (!o.attention_recompute || !has_attention || !may_choose) return kept;
  // Recomputing the attention scores costs FLOPs but shrinks every block's activations: it
  // pays where it saves more, in fewer shards or fewer shards recomputing their whole forward
  // (the estimated compute of a step decides; fewer shards also move less), or where the
  // trial fits no other way.
  return Faster(std::move(kept), plan_for(AttentionMemory::kRecomputed));
}

}  // namespace

StatusOr<PartitionPlan> PlanShards(const Trial& trial, const PartitionOptions& o) {
  auto plan = PlanPlaced(trial, o, Placing::kAsOptions);
  // Left to the cost model, the optimizer also steps on the host where its state on the
  // device is what does not fit: a trial an operator's --optimizer=host would train is not
  // refused under auto.
  const bool may_fall_back = !plan.ok() && plan.status().code() == StatusCode::kResourceExhausted &&
                             !o.optimizer_placement && o.state_tier == StateTier::kHost &&
                             ChooseOptimizerPlacement(trial, o) == OptimizerPlacement::kDevice;
  if (!may_fall_back) return plan;
  return PlanPlaced(trial, o, Placing::kHostToFit);
}

std::string ShardLayers(const ShardPlan& shard) {
  if (shard.first_name == shard.last_name) return shard.first_name;
  return shard.first_name + ".." + shard.last_name;
}

std::string FormatPlan(const Trial& trial, const PartitionPlan& plan) {
  std::ostringstream out;
  out << trial.name << " (" << PrecisionName(trial.training.precision)
      << "): " << plan.shards.size() << " shard" << (plan.shards.size() == 1 ? "" : "s")
      << ", state " << FormatBytes(plan.total_state_bytes) << " in the "
      << (plan.state_tier == StateTier::kDisk ? "disk" : "host") << " tier, peak device "
      << FormatBytes(plan.peak_device_bytes);
  if (plan.pinned_bytes > 0)
    out << " (" << FormatBytes(plan.pinned_bytes) << " pinned tied weights)";
  if (plan.buffer_bytes > 0) out << " (" << FormatBytes(plan.buffer_bytes) << " of buffers)";
  if (plan.attention == AttentionMemory::kRecomputed) {
    out << ", attention scores recomputed in backward";
  } else if (plan.attention == AttentionMemory::kFused) {
    out << ", attention fused (no scores kept)";
  }
  if (plan.selective_recompute) out << ", LayerNorm and GELU outputs recomputed in backward";
  const bool keeps =
      std::any_of(plan.shards.begin(), plan.shards.end() - 1,
                  [](const ShardPlan& s) { return s.policy == ActivationPolicy::kStash; });
  if (plan.stash_on_device && keeps) out << ", stashed graphs kept in device memory";
  if (plan.offloaded_bytes > 0) {
    const auto inputs = std::count_if(plan.shards.begin(), plan.shards.end(),
                                      [](const ShardPlan& s) { return s.input_offloaded; });
    const bool graphs = std::any_of(plan.shards.begin(), plan.shards.end(), [](const ShardPlan& s) {
      return s.policy == ActivationPolicy::kOffload;
    });
    out << ", " << FormatBytes(plan.offloaded_bytes) << " of "
        << (graphs ? (inputs > 0 ? "graphs and inputs" : "graphs") : "inputs")
        << " offloaded to host memory";
    if (inputs > 0) out << " (the inputs of " << inputs << " recomputing shards)";
  }
  if (plan.optimizer_on_host_to_fit) {
    out << ", optimizer on the host: no sharding fits with its state on the device";
  }
  if (plan.resident_bytes > 0) {
    out << ", " << FormatBytes(plan.resident_bytes)
        << " of state resident on the device between steps (optimizer \"resident\")";
  }
  if (plan.link_seconds > 0) {
    char link[64];
    std::snprintf(link, sizeof(link), ", host link %.3f s a step", plan.link_seconds);
    out << link;
  }
  out << "\n";
  char line[256];
  std::snprintf(line, sizeof(line), "  %5s  %-19s  %10s  %11s  %11s  %11s  %-9s  %-9s  %8s\n",
                "shard", "layers", "params", "state", "grads", "activations", "policy", "optimizer",
                "est. s");
  out << line;
  for (size_t i = 0; i < plan.shards.size(); ++i) {
    const auto& s = plan.shards[i];
    const std::string layers = ShardLayers(s);
    std::snprintf(
        line, sizeof(line), "  %5zu  %-19s  %10lld  %11s  %11s  %11s  %-9s  %-9s  %8.3f\n", i,
        layers.c_str(), static_cast<long long>(s.parameters), FormatBytes(s.state_bytes).c_str(),
        FormatBytes(s.gradient_bytes).c_str(), FormatBytes(s.activation_bytes).c_str(),
        ActivationPolicyName(s.policy),
        s.resident ? "resident" : OptimizerPlacementName(s.optimizer), s.estimated_seconds);
    out << line;
  }
  return out.str();
}

int64_t SpillDiskBytes(const Trial& trial, const PartitionPlan& plan) {
  if (plan.state_tier != StateTier::kDisk) return 0;
  int64_t largest = 0, gradients = 0, layers = 0;
  for (const auto& sh : plan.shards) {
    largest = std::max(largest, sh.state_bytes);
    gradients += sh.gradient_bytes;
    layers += sh.last_layer - sh.first_layer + 1;
  }
  // Spill files put each tensor on a 4 KiB boundary and end with a 4 KiB block: allow 128
  // tensors' padding per layer (weights, optimizer state, gradients and the rewritten copy of
  // the largest shard; a GPT-2 block has 12 parameter tensors, so 60 with AdamW) and 5 blocks
  // per shard. An estimate for TorchScript layers with many more tensors.
  const int64_t alignment = 4096 * (128 * layers + 5 * static_cast<int64_t>(plan.shards.size()));
  return plan.total_state_bytes + largest + (trial.training.grad_clip_norm > 0 ? gradients : 0) +
         alignment;
}

}  // namespace hydra
