"""Benchmarks: celery-extras side by side with plain Celery, in one run, on this machine."""
