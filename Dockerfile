# syntax=docker/dockerfile:1
#
# The arcwright controller image: one static binary, the bundled policies
# compiled into it, running as a non-root user on an image with nothing else
# in it (no shell, no package manager).
#
#   docker build -t ghcr.io/arcwright-dev/arcwright:0.1.0 .
#
# Builder: Alpine's Rust links against musl, so the binary is static and
# needs no libc in the final image. host/build.rs compiles the policy guests
# with a nested `cargo build --target wasm32-wasip2` and embeds them, so that
# target must be installed here; the guests' sources (policies/, wit/) are
# part of the build context for the same reason.
FROM rust:1.95-alpine AS build
RUN apk add --no-cache musl-dev \
 && rustup target add wasm32-wasip2
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p arcwright --bin arcwright \
 && cp target/release/arcwright /arcwright

# Runtime: distroless "static" has CA certificates (the Actions service is
# HTTPS), /etc/passwd with the nonroot user (65532) and nothing to exec into.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /arcwright /usr/local/bin/arcwright
USER 65532:65532
# /metrics, /healthz, /readyz.
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/arcwright"]
CMD ["run"]
