# syntax=docker/dockerfile:1
# One image, both binaries. Build: docker build -t groundskeeper:dev .
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# .git is not in the build context: pass the commit for groundskeeper_build_info's revision
# (docker build --build-arg GROUNDSKEEPER_REVISION=$(git rev-parse HEAD) .), else "unknown".
ARG GROUNDSKEEPER_REVISION=
ENV GROUNDSKEEPER_REVISION=$GROUNDSKEEPER_REVISION
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bins \
 && install -D -m 0755 target/release/controller-manager /out/controller-manager \
 && install -D -m 0755 target/release/node-agent /out/node-agent

# distroless/cc: glibc and libgcc only, no shell. Non-root by default (uid 65532); the
# node-agent DaemonSet runs it as uid 0 with NET_ADMIN only (see the chart).
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/controller-manager /out/node-agent /usr/local/bin/
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/controller-manager"]
