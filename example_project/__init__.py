"""An example Celery project using celery-extras; run it with ``python -m example_project``."""
