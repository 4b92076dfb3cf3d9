# One image with both Hydra binaries (hydra-controller, hydra-agent) and the hydra CLI, for the
# Helm chart in helm/hydra (docs/install.md).
#
#   docker build -t registry.example.com/hydra:0.1.0 .
#
# The build stage runs the repository's own scripts (scripts/setup.sh installs the Debian
# packages, scripts/build.sh builds with CMake + Ninja); the runtime stage holds only the shared
# libraries the binaries load, and runs as an unprivileged user (UID/GID 65532, the chart's
# default runAsUser). LibTorch is Debian's libtorch 1.13 (CPU only): this image trains on CPU
# devices; a CUDA image needs a CUDA build of LibTorch instead (see docs/install.md).
# This file has not been built in the project's CI (it has no container runtime).

FROM debian:bookworm AS build
WORKDIR /src
COPY scripts/setup.sh scripts/setup.sh
RUN bash scripts/setup.sh && rm -rf /var/lib/apt/lists/*
COPY . .
RUN rm -rf build build-asan \
 && HYDRA_BUILD_DIR=/build HYDRA_JOBS="$(nproc)" bash scripts/build.sh \
      -DCMAKE_BUILD_TYPE=Release -DHYDRA_BUILD_TESTS=OFF -DHYDRA_BUILD_BENCH=OFF \
 && mkdir -p /out \
 && cp /build/controller/hydra-controller /build/agent/hydra-agent /build/cli/hydra /out/ \
 && strip /out/*

FROM debian:bookworm-slim
# The runtime counterparts of setup.sh's -dev packages; apt resolves their own dependencies.
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      libtorch1.13 libopenblas0-pthread libgrpc++1.51 libgrpc29 libprotobuf32 \
      libcpprest2.10 libprometheus-cpp-core1.0 libyaml-cpp0.7 libxxhash0 zlib1g libssl3 \
      ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 65532 hydra \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin hydra
COPY --from=build /out/ /usr/local/bin/
# Every binary must find all of its libraries.
RUN for b in /usr/local/bin/hydra*; do ! ldd "$b" | grep -q 'not found' || { ldd "$b"; exit 1; }; done
USER 65532:65532
CMD ["hydra-agent", "--help"]
