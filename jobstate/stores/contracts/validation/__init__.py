"""The argument checks of the store contracts, at one import address.

Every store (ours, the in-memory references and a host's) runs them through the
contracts' public methods, so each refuses bad input with the same error before it
writes anything. They are split by what they check:

- :mod:`.values`: the plain values every method takes (text, ids, instants, durations,
  counts, statuses, targets), and :func:`column_limit`, which reads a column's
  ``max_length`` from the model;
- :mod:`.job_fields`: a job's fields (which operation may write which, their values,
  the claim fields a release clears) and the errors of intake;
- :mod:`.state_arguments`: the state store's other arguments (batches of reports and
  claims, refire, reject and approval, notifications);
- :mod:`.run_arguments`: the run store's arguments.
"""

# The submodules' __all__ say what each exports; the package re-exports all of it.
from jobstate.stores.contracts.validation import (
    job_fields,
    run_arguments,
    state_arguments,
    values,
)
from jobstate.stores.contracts.validation.job_fields import *  # noqa: F403
from jobstate.stores.contracts.validation.run_arguments import *  # noqa: F403
from jobstate.stores.contracts.validation.state_arguments import *  # noqa: F403
from jobstate.stores.contracts.validation.values import *  # noqa: F403

__all__ = [*values.__all__, *job_fields.__all__, *state_arguments.__all__]
__all__ += run_arguments.__all__
