"""client-go retry policies (:mod:`.policies`), the failure memory they count in
(:mod:`.failure_memory`), and the hook that retries a task with them (:mod:`.hook`)."""
