"""The services behind the operators' console: which jobs a search means
(:mod:`.job_search`), bulk operations over them (:mod:`.bulk`) and the figures of the
Queues page (:mod:`.queue_stats`). The admin's pages (:mod:`jobstate.admin`) call these and
hold no queries of their own.
"""
