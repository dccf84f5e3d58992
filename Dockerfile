# walfold: one static-ish binary on a slim base.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release -p walfold --locked

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* && useradd --system walfold
COPY --from=build /src/target/release/walfold /usr/local/bin/walfold
USER walfold
ENTRYPOINT ["walfold"]
CMD ["run", "--config", "/etc/walfold/walfold.toml"]
