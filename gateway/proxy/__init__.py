"""The proxy: the front server hosts talk to, upstream supervision, the routing table, catalog mode,
and the transports on both sides."""
