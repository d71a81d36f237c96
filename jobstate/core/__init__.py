"""jobstate's vocabulary, below everything else: the statuses and value types
(:mod:`.states`), the JSON rules for stored values (:mod:`.jsonvalues`), clocks
(:mod:`.clock`), the ``JOBSTATE`` settings (:mod:`.conf`) and the attempt log of a task
(:mod:`.attempt_log`).

Nothing here imports models, stores or Django's app registry, so every other package may
import it.
"""
