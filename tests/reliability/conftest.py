"""The reliability suite uses the integration fixtures: real workers on real brokers."""

from tests.integration.conftest import broker, cluster, journal, ns, send, store

__all__ = ["broker", "cluster", "journal", "ns", "send", "store"]
