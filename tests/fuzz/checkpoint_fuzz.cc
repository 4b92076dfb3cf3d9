// Fuzz target: the checkpoint reader (agent/executor/checkpoint.h), fed any bytes as a .hck
// file through an in-memory file. A file it accepts must survive a write and read back.

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "agent/executor/checkpoint.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

namespace fs = std::filesystem;
using hydra::executor::CheckpointData;
using hydra::fuzz::Require;

/// One in-memory file, reused for every input.
int InputFile() {
  static const int fd = ::memfd_create("hydra-fuzz-checkpoint", MFD_CLOEXEC);
  Require(fd >= 0, "memfd_create works");
  return fd;
}

/// A directory for the round trip of accepted inputs, removed at exit.
const fs::path& ScratchDir() {
  static const fs::path dir = [] {
    const fs::path base = fs::exists("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
    fs::path d = base / ("hydra-fuzz-checkpoint-" + std::to_string(::getpid()));
    fs::create_directories(d);
    std::atexit([] { fs::remove_all(ScratchDir()); });
    return d;
  }();
  return dir;
}

bool SameBuffers(const CheckpointData& a, const CheckpointData& b) {
  if (a.buffers.size() != b.buffers.size()) return false;
  for (size_t i = 0; i < a.buffers.size(); ++i) {
    const auto& x = a.buffers[i];
    const auto& y = b.buffers[i];
    if (x.name != y.name || x.dtype != y.dtype || x.shape != y.shape || x.data != y.data) {
      return false;
    }
  }
  return true;
}

void CheckRoundTrip(const CheckpointData& data) {
  const std::string path = (ScratchDir() / "round-trip.hck").string();
  const hydra::Status written = hydra::executor::WriteCheckpointFile(path, data);
  Require(written.ok(), "an accepted checkpoint can be written: " + written.ToString());
  auto back = hydra::executor::ReadCheckpointFile(path);
  Require(back.ok(), "a written checkpoint reads back: " + back.status().ToString());
  Require(back->meta == data.meta && SameBuffers(*back, data), "a round trip changes nothing");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = InputFile();
  Require(::ftruncate(fd, 0) == 0, "ftruncate works");
  size_t done = 0;
  while (done < size) {
    const ssize_t w = ::pwrite(fd, data + done, size - done, static_cast<off_t>(done));
    Require(w > 0, "pwrite to memory works");
    done += static_cast<size_t>(w);
  }
  auto read = hydra::executor::ReadCheckpointFd(fd, "fuzz-input.hck");
  if (!read.ok()) {
    Require(read.status().code() == hydra::StatusCode::kDataLoss,
            "a malformed checkpoint is DATA_LOSS: " + read.status().ToString());
    return 0;
  }
  size_t bytes = 0;
  for (const auto& b : read->buffers) bytes += b.data.size();
  Require(bytes <= size, "the buffers read fit in the input");
  CheckRoundTrip(*read);
  return 0;
}
