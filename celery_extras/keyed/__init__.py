"""One key-run machinery: what coalescing, debounce and memoize share (a key's run and
waiting hold under leases, orphans, covered ids and their endings, the worker's holds and
renewals, parking long waits). Each policy is a pure rules table and its Lua part on it."""
