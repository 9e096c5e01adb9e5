"""`/metrics` on the HTTP front: the usage figures since start in the Prometheus text format.

Written by `prometheus-client` (imported on the first scrape, not at start). Served under the same
rules as `/mcp`: the Host/Origin checks, and the bearer token whenever one is configured.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings

from gateway.services.stats import BUCKETS, Stats


def render(stats: Stats, upstream_states: Mapping[str, str]) -> bytes:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

    class Figures:
        def collect(self) -> Iterator[Any]:
            replica = stats.replica  # every series names its replica: one Prometheus scrapes them all
            labels = ["replica", "server", "tool", "via"]
            families = {
                "calls": CounterMetricFamily("mcp_gateway_calls", "Tool calls through the gateway", labels=labels),
                "errors": CounterMetricFamily("mcp_gateway_errors", "Tool calls that ended in an error", labels=labels),
                "result_bytes": CounterMetricFamily(
                    "mcp_gateway_result_bytes", "Bytes of upstream results (before offload)", labels=labels
                ),
                "tokens_returned": CounterMetricFamily(
                    "mcp_gateway_tokens_returned", "Estimated tokens returned to hosts", labels=labels
                ),
            }
            saved = CounterMetricFamily(
                "mcp_gateway_tokens_saved", "Estimated tokens kept out of the window", labels=[*labels, "by"]
            )
            for (server, tool, via), t in sorted(stats.by_key.items()):
                values = [replica, server, tool, via]
                for name, family in families.items():
                    if via != "list" or name == "tokens_returned":
                        family.add_metric(values, getattr(t, name))
                for by, n in sorted(t.saved.items()):
                    saved.add_metric([*values, by], n)
            yield from families.values()
            yield saved
            latency = HistogramMetricFamily(
                "mcp_gateway_call_seconds", "Tool call latency", labels=["replica", "server"]
            )
            for server, counts in sorted(stats.latency.items()):
                cumulative, buckets = 0, []
                for bound, n in zip((*map(str, BUCKETS), "+Inf"), counts, strict=True):
                    cumulative += n
                    buckets.append((bound, cumulative))
                total = sum(t.seconds for (s, _, v), t in stats.by_key.items() if s == server and v != "list")
                latency.add_metric([replica, server], buckets, total)
            yield latency
            up = GaugeMetricFamily(
                "mcp_gateway_upstream_up", "1 when the upstream is connected", labels=["replica", "server"]
            )
            for server, state in upstream_states.items():
                up.add_metric([replica, server], 1.0 if state == "ok" else 0.0)
            yield up

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Figures())
    return generate_latest(registry)


class MetricsEndpoint:
    """The ASGI endpoint: Host/Origin checked as for `/mcp` (DNS rebinding), then the figures."""

    def __init__(self, stats: Stats, states: Any, security: TransportSecuritySettings):
        self.stats = stats
        self.states = states  # () -> {server: state}
        self.security = TransportSecurityMiddleware(security)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        from starlette.requests import Request
        from starlette.responses import Response

        refused = await self.security.validate_request(Request(scope, receive), is_post=False)
        if refused is not None:
            await refused(scope, receive, send)
            return
        body = render(self.stats, self.states())
        await Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")(scope, receive, send)
