# A small runtime image with the one binary. Untested here (these machines have no container
# runtime); it follows the conventional two-stage Rust build.
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin fragscope

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates && rm -rf /var/lib/apt/lists/* \
    && useradd --system --home-dir /data fragscope && mkdir -p /data && chown fragscope /data
COPY --from=build /src/target/release/fragscope /usr/local/bin/fragscope
USER fragscope
WORKDIR /data
ENV FRAGSCOPE_ADDR=0.0.0.0:8080 FRAGSCOPE_DATA_DIR=/data
EXPOSE 8080
HEALTHCHECK --interval=30s --timeout=5s CMD ["/bin/sh", "-c", "exec 3<>/dev/tcp/127.0.0.1/8080"]
ENTRYPOINT ["fragscope", "serve"]
