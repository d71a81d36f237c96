"""Benchmarks of django-jobstate. Each module runs with ``python -m bench.<name>``."""
