"""Lamport clock and revoked-set sync between workers, durable across restarts."""

__all__: list[str] = []
