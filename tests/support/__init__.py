"""Shared test support: brokers, a namespaced test app, real worker processes."""
