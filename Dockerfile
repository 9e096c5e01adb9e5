# mcp-context-gateway in a container (docs/hosts.md: Docker). stdio by default: `docker run -i --rm ...`.
# HTTP: `-e CTX_TRANSPORT=http -e CTX_AUTH_TOKEN="$(openssl rand -hex 24)" -p 8808:8808`: it listens on every
# interface of the container (CTX_HOST=0.0.0.0), and refuses to without a token of 16 characters or more.
# Mount the folder holding your gateway.toml on /config (read-only is fine; a single-file mount misses
# saves by rename, so live reload would stop), a named volume on /home/gateway/.npm (npx downloads
# once), and the workspace /data (a named volume; a bind mount must be writable by the user the container
# runs as: `--user "$(id -u):$(id -g)"`). Built and run by tests/container/build.sh and the opt-in
# tests/test_container.py.
ARG BASE=debian:bookworm-slim
FROM ${BASE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates nodejs npm \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 gateway \
    && mkdir -p /data /config /home/gateway/.npm && chown gateway /data /home/gateway/.npm
COPY . /src
# a wheel is built in a temporary folder and installed; the sources (and any build/ or egg-info) go
RUN python3 -m venv /opt/gateway \
    && /opt/gateway/bin/pip install --no-cache-dir --disable-pip-version-check /src \
    && cp /src/config.example.toml /config/gateway.toml \
    && rm -rf /src
USER gateway
ENV PATH=/opt/gateway/bin:$PATH \
    CTX_WORKSPACE=/data \
    CTX_HOST=0.0.0.0 \
    CTX_LLM_BASE_URL=http://host.docker.internal:1234/v1 \
    PYTHONDONTWRITEBYTECODE=1
VOLUME ["/data"]
EXPOSE 8808
ENTRYPOINT ["mcp-context-gateway"]
CMD ["serve", "--config", "/config/gateway.toml"]
