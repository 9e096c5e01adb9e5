# mcp-context-gateway: stdio by default (docker run -i), HTTP with CTX_TRANSPORT=http.
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends nodejs npm \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 gateway
WORKDIR /app
COPY pyproject.toml README.md config.example.toml ./
COPY gateway ./gateway
COPY plugins ./plugins
RUN pip install --no-cache-dir . && mkdir -p /data /config && chown gateway /data /config
USER gateway
ENV CTX_WORKSPACE=/data CTX_HOST=127.0.0.1
VOLUME ["/data"]
EXPOSE 8808
ENTRYPOINT ["mcp-context-gateway"]
CMD ["serve", "--config", "/app/config.example.toml"]
