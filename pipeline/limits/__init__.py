"""Limits on judge calls: calls in flight, requests and tokens per minute (`limiter`),
and the leases that share them across a cluster (`leases`)."""

__all__: list[str] = []
