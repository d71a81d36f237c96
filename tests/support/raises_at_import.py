"""A task module that fails when imported with something other than an ImportError, as a
module whose code raises at import time does (a bad setting read at import, a task
decorated for a queue its backend does not list)."""

raise RuntimeError("this module fails at import on purpose")
