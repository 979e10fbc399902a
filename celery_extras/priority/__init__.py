"""Priorities that mean what they say (``extras_priority``): ten distinct levels on Redis,
the request chosen by priority when a pool process frees, and aging."""

from .buffer import PriorityBuffer, amqp_level, redis_level

__all__ = ["PriorityBuffer", "amqp_level", "redis_level"]
