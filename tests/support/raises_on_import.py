"""A task module that raises while it is imported, as one that needs a setting the
importing process lacks: the results of its tasks still read from any process."""

raise RuntimeError("this module needs a setting this process does not have")
