"""The Redis store as a worker uses it: clients (:mod:`.client`), whether it answers
(:mod:`.health`), and whether it may lose what celery-extras keeps there (:mod:`.safety`)."""
