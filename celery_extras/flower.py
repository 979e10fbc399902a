"""celery-extras inside Flower: the public ``flowerconfig.py`` line, kept where users import it.

One line in ``flowerconfig.py``, run as ``celery -A proj flower --conf=flowerconfig.py``::

    from celery_extras.flower import in_flower; in_flower()

adds the ``/extras`` page and the Prometheus families on ``/metrics``. This module
only re-exports :mod:`celery_extras.stats.flower`, where the page lives with the
rest of the stats; it imports neither Flower nor ``prometheus-client``.
"""

from __future__ import annotations

from .stats.flower import LiveState, in_flower, page_data, readable

__all__ = ["LiveState", "in_flower", "page_data", "readable"]
