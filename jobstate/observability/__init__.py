"""What monitoring reads: the Prometheus exposition of the operational metrics
(:mod:`.metrics`) and the health, readiness and metrics views (:mod:`.views`, routed by
:mod:`jobstate.urls`).
"""
