"""Weighted fair consumption across a worker's queues, and a mixin for plain kombu consumers."""

from .mixin import FairConsumerMixin
from .weighted_cycle import WeightedCycle, WeightedOrder

__all__ = ["FairConsumerMixin", "WeightedCycle", "WeightedOrder"]
