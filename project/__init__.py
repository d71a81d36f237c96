# Load the Celery app whenever Django starts, so @shared_task binds to it. Celery is in the
# dev dependency group only: the light demo (scripts/demo) runs without it, on
# jobstate_worker, so the app loads only where Celery is installed.
from importlib.util import find_spec

__all__: list[str] = []

if find_spec("celery") is not None:
    from project.celery import app as celery_app

    __all__ = ["celery_app"]
