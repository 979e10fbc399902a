"""Per-task token-bucket limits and client-go style retry policies."""

__all__: list[str] = []
