"""What a store is: the contracts a backend implements and the argument checks every
implementation shares. The database backends live in :mod:`jobstate.stores.database`, the
in-memory references in :mod:`jobstate.testing`.
"""
