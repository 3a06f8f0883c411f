# syntax=docker/dockerfile:1
# One image, every binary: the same files, user and entrypoint as `make image` (image/build.sh),
# for people who build with a container builder. Build: docker build -t groundskeeper:dev .
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# .git is not in the build context: pass the commit for groundskeeper_build_info's revision
# (docker build --build-arg GROUNDSKEEPER_REVISION=$(git rev-parse HEAD) .), else "unknown".
ARG GROUNDSKEEPER_REVISION=
ENV GROUNDSKEEPER_REVISION=$GROUNDSKEEPER_REVISION
# The same paths in the binaries as `make image` gives them (image/build.sh): cargo's home as
# /cargo, the sources as /src, so no path of the build machine is in a panic message.
ENV RUSTFLAGS="--remap-path-prefix=/usr/local/cargo=/cargo --remap-path-prefix=/src=/src --remap-path-prefix=/src/target=/src/target"
# Built as `make image` builds them, with `cargo auditable` (the pinned one, .ci/cargo-install.sh,
# kept in a cache): each binary carries its crate list for scanners.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    --mount=type=cache,target=/src/.tools \
    bash .ci/cargo-install.sh cargo-auditable \
 && PATH=/src/.tools/bin:$PATH cargo auditable build --release --locked --bins -p groundskeeper-controllers -p groundskeeper-node-agent \
 && install -D -m 0755 target/release/controller-manager /out/controller-manager \
 && install -D -m 0755 target/release/node-agent /out/node-agent \
 && install -D -m 0755 target/release/kubectl-groundskeeper /out/kubectl-groundskeeper

# The distroless-style root filesystem from Debian 12's own packages, laid out by the same
# script as `make image`: base files, glibc, libgcc, the CA bundle, netbase, their dpkg
# records and copyrights, passwd with nonroot (65532).
FROM debian:12 AS rootfs
COPY image/rootfs.sh /rootfs.sh
RUN apt-get update -qq && bash /rootfs.sh /rootfs /debs

FROM scratch
COPY --from=rootfs /rootfs/ /
COPY --from=build /out/controller-manager /out/node-agent /out/kubectl-groundskeeper /usr/local/bin/
ENV PATH=/usr/local/bin:/usr/bin:/bin
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/controller-manager"]
