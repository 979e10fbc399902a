"""The randomized checker of celery-extras' promises (docs/reliability.rst): a seeded
workload of tasks under random stacks of policies, in random canvas, sent by several
producers to a few workers on a random pool, with faults injected at random moments; a
journal of every body kept outside the system under test; and a checker of the history.

``workload`` and ``checker`` are pure (a seed gives the same workload and fault
schedule; the checker reads a history); ``runner`` runs one seed against real workers
and brokers; ``test_chaos`` runs CI's fixed seeds; ``python -m bench chaos`` runs random
seeds for as long as it is asked.
"""
