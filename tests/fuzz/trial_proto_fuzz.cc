// Fuzz target: the agent's decoder of assigned trials (proto/trial_proto.h), fed any bytes as
// a serialized TrialSpec.

#include <google/protobuf/util/message_differencer.h>

#include <cstddef>
#include <cstdint>

#include "proto/trial_proto.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using hydra::fuzz::Require;
  hydra::agent::v1::TrialSpec spec;
  if (!spec.ParseFromArray(data, static_cast<int>(size))) return 0;
  auto trial = hydra::wire::TrialFromProto(spec);
  if (!trial.ok()) {
    Require(trial.status().code() == hydra::StatusCode::kInvalidArgument,
            "a refused trial is INVALID_ARGUMENT: " + trial.status().ToString());
    return 0;
  }
  const hydra::Status valid = hydra::ValidateTrial(*trial, "trial.");
  Require(valid.ok(), "a decoded trial is valid: " + valid.ToString());
  // What the decoder keeps survives encoding and decoding again unchanged.
  hydra::agent::v1::TrialSpec encoded;
  hydra::wire::TrialToProto(*trial, &encoded);
  auto again = hydra::wire::TrialFromProto(encoded);
  Require(again.ok(), "a re-encoded trial decodes: " + again.status().ToString());
  hydra::agent::v1::TrialSpec reencoded;
  hydra::wire::TrialToProto(*again, &reencoded);
  Require(google::protobuf::util::MessageDifferencer::Equals(encoded, reencoded),
          "decode(encode(trial)) == trial");
  return 0;
}
