"""Time-wheel throughput statistics per task, emitted as Celery events."""

__all__: list[str] = []
