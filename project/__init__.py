# The demo project's Celery app lives in project.celery, and `celery -A project worker`
# (or beat) finds it there by itself. It is not imported when Django starts, as Celery's
# guide suggests for projects whose web processes send tasks with @shared_task: nothing
# in this project sends a Celery task from a Django process (beat sends jobstate's
# maintenance tasks), and importing Celery would add about a third of a second to every
# manage.py command, the workers' start-up included.
