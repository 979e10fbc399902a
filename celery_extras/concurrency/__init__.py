"""Concurrency slots: the pure slot table (:mod:`.slot_table`), the Redis slots
(:mod:`.redis_slots`) and the slot gate of the admission pipeline (:mod:`.gate`)."""
