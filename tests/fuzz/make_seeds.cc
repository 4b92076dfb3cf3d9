// Writes the seed corpora of the fuzz targets with the real writers, from small real inputs:
//   fuzz_make_seeds <repository root>
// fills <root>/tests/fuzz/corpus/{manifest,checkpoint,spill_trailer,trial_proto,safetensors}/.

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "agent/executor/checkpoint.h"
#include "agent/executor/disk_tier.h"
#include "agent/executor/safetensors.h"
#include "common/job.h"
#include "proto/trial_proto.h"

namespace {

namespace fs = std::filesystem;
using namespace hydra;

std::vector<char> Floats(size_t n, float first) {
  std::vector<char> bytes(n * sizeof(float));
  for (size_t i = 0; i < n; ++i) {
    const float v = first + 0.5f * static_cast<float>(i);
    std::memcpy(bytes.data() + i * sizeof(float), &v, sizeof(v));
  }
  return bytes;
}

/// Checkpoints as the agent writes them: metadata and a few state buffers, and an empty one.
Status WriteCheckpoints(const fs::path& out) {
  executor::CheckpointData data;
  data.meta = {{"trial", "tiny-sweep-lr0.001"},
               {"fingerprint", "seed"},
               {"step", 7},
               {"trainCurve", {{{"step", 1}, {"loss", 5.5}}, {{"step", 7}, {"loss", 4.25}}}}};
  data.buffers = {{"wte.weight", "float32", {4, 3}, Floats(12, -1.0f)},
                  {"wte.weight.exp_avg", "float32", {4, 3}, Floats(12, 0.25f)},
                  {"empty", "float32", {0}, {}},
                  {"rng", "int64", {2}, std::vector<char>(16, '\x11')}};
  executor::CheckpointStore store(out.string(), 3);
  RETURN_IF_ERROR(store.Save(0, executor::CheckpointData{{{"step", 0}}, {}}));
  return store.Save(7, data);
}

/// Spill files as the disk tier writes them: two parts, and none (the trailer alone).
Status WriteSpillFiles(const fs::path& out) {
  const fs::path dir = out / "tier";
  executor::DiskTier tier(dir.string());
  RETURN_IF_ERROR(tier.Init());
  std::vector<char> a = Floats(25, 3.0f);
  std::vector<char> b(37, 'b');
  RETURN_IF_ERROR(tier.WriteSync("two-parts", {{a.data(), a.size()}, {b.data(), b.size()}}));
  RETURN_IF_ERROR(tier.WriteSync("no-parts", {}));
  for (const char* key : {"two-parts", "no-parts"}) {
    fs::copy_file(dir / (std::string(key) + ".spill"), out / (std::string(key) + ".spill"),
                  fs::copy_options::overwrite_existing);
  }
  return OkStatus();  // the tier removes its files and directory
}

/// The serialized TrialSpecs of every trial of two example manifests.
Status WriteTrialSpecs(const fs::path& root, const fs::path& out) {
  for (const char* manifest : {"examples/tiny-sweep.yaml", "examples/images/sweep.yaml"}) {
    ASSIGN_OR_RETURN(MultiModelJob job, LoadJobFile((root / manifest).string()));
    ASSIGN_OR_RETURN(std::vector<Trial> trials, ExpandTrials(job));
    for (const auto& trial : trials) {
      agent::v1::TrialSpec spec;
      wire::TrialToProto(trial, &spec);
      std::ofstream(out / (trial.name + ".pb"), std::ios::binary) << spec.SerializeAsString();
    }
  }
  return OkStatus();
}

/// Safetensors files as `hydra export` writes them: a small GPT-2-like set of F32 and BF16
/// tensors with metadata, an empty tensor, and no tensors at all.
Status WriteSafetensors(const fs::path& out) {
  using executor::SafetensorsDtype;
  const std::vector<char> wte = Floats(12, -1.0f), ln = Floats(3, 1.0f);
  const std::vector<char> half(6, '\x3f');
  ASSIGN_OR_RETURN(
      std::string model,
      executor::SerializeSafetensors(
          {{"transformer.wte.weight", SafetensorsDtype::kF32, {4, 3}, wte.data(), wte.size()},
           {"transformer.ln_f.weight", SafetensorsDtype::kF32, {3}, ln.data(), ln.size()},
           {"transformer.ln_f.bias", SafetensorsDtype::kBF16, {3}, half.data(), half.size()},
           {"empty", SafetensorsDtype::kF16, {0, 3}, nullptr, 0}},
          {{"format", "pt"}}));
  ASSIGN_OR_RETURN(std::string none, executor::SerializeSafetensors({}, {}));
  std::ofstream(out / "model.safetensors", std::ios::binary) << model;
  std::ofstream(out / "none.safetensors", std::ios::binary) << none;
  return OkStatus();
}

/// The example manifests, flattened: examples/images/sweep.yaml -> images-sweep.yaml.
void CopyManifests(const fs::path& root, const fs::path& out) {
  for (const auto& entry : fs::recursive_directory_iterator(root / "examples")) {
    if (entry.path().extension() != ".yaml") continue;
    std::string name = fs::relative(entry.path(), root / "examples").string();
    for (char& c : name) c = c == '/' ? '-' : c;
    fs::copy_file(entry.path(), out / name, fs::copy_options::overwrite_existing);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <repository root>\n", argv[0]);
    return 2;
  }
  const fs::path root = argv[1];
  const fs::path corpus = root / "tests/fuzz/corpus";
  for (const char* target :
       {"manifest", "checkpoint", "spill_trailer", "trial_proto", "safetensors"}) {
    fs::create_directories(corpus / target);
  }
  CopyManifests(root, corpus / "manifest");
  for (const Status& s :
       {WriteCheckpoints(corpus / "checkpoint"), WriteSpillFiles(corpus / "spill_trailer"),
        WriteTrialSpecs(root, corpus / "trial_proto"), WriteSafetensors(corpus / "safetensors")}) {
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
  }
  return 0;
}
