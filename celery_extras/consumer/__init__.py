"""Weighted fair consumption across a worker's queues."""

__all__: list[str] = []
