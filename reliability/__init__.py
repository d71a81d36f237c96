"""Fault-injection harnesses: ``python -m reliability.torture`` (workers killed with
SIGKILL while a reaper runs) and ``python -m reliability.restart`` (PostgreSQL restarted
under load). Short runs of both are part of the test suite; long runs take ``--duration``.
"""
