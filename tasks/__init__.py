"""Celery tasks. Each task takes ids, does one step, records the outcome in the database."""
