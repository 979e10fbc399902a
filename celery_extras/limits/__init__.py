"""Token-bucket limits: the pure maths (:mod:`.token_bucket`, :mod:`.rate`), the limits'
decisions (:mod:`.planner`), the Redis buckets (:mod:`.redis_bucket`) and the limit gate
of the admission pipeline (:mod:`.gate`)."""
