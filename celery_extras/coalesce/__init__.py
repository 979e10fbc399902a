"""Coalescing (client-go's workqueue for Celery): the holds table, its Redis form, the gate."""
