"""What MariaDB and MySQL need to give jobstate's guarantees; nothing on other backends.

Django creates a ``UniqueConstraint`` with a ``condition`` as nothing there (models.W036)
and drops the condition of a partial index (models.W037), so this migration adds, on
those servers only:

- for each partial unique constraint, a nullable STORED generated column that holds the
  guarded value while the row is in the guarded state and NULL otherwise, with a plain
  unique index of the constraint's own name (a unique index admits many NULLs), so the
  server enforces it and the stores recognise its violation by name;
- the thread gate table, whose row locks stand in for PostgreSQL's transaction-scoped
  advisory locks on a thread (claims through the per-thread gate, quota counts);
- full indexes led by the state column where a claim or sweep would otherwise read the
  history through an index Django created without its condition.

The generated columns compare with a binary, no-pad collation, so two keys that differ
only in case or trailing spaces stay two keys, as on PostgreSQL. Adding a STORED column
rebuilds the table; on a large ``jobstate_jobrun`` table run it in a quiet moment.
"""

from django.db import migrations

#: (table, column, generated column definition, unique index, indexed columns)
GUARDS = [
    (
        "jobstate_jobrun",
        "running_overlap_key",
        "VARCHAR(300) CHARACTER SET utf8mb4 COLLATE {nopad} GENERATED ALWAYS AS "
        "(CASE WHEN `status` = 'RUNNING' THEN `overlap_key` END) STORED",
        "jobstate_jobrun_one_running_per_overlap_key",
        "`running_overlap_key`",
    ),
    (
        "jobstate_scheduleoccurrence",
        "cron_slot",
        "DATETIME(6) GENERATED ALWAYS AS (CASE WHEN `trigger` = 'cron' THEN `slot` END) STORED",
        "jobstate_schedule_once_per_slot",
        "`schedule_id`, `cron_slot`",
    ),
]

THREAD_GATE = "jobstate_threadgate"

#: (table, index, columns): the partial indexes' work, led by the state they select.
INDEXES = [
    ("jobstate_job", "jobstate_job_my_claim_idx", "`status`, `target`, `created_at`, `id`"),
    (
        "jobstate_job",
        "jobstate_job_my_task_claim_idx",
        "`status`, `target`, `queue_name`, `priority`, `created_at`",
    ),
    ("jobstate_notification", "jobstate_notif_my_due_idx", "`state`, `next_attempt_at`, `id`"),
]


def _nopad_binary(connection):
    return "utf8mb4_nopad_bin" if connection.mysql_is_mariadb else "utf8mb4_0900_bin"


def _ignores_constraint_conditions(connection):
    # The guards stand in for partial unique constraints where the database ignores a
    # constraint's condition: among the databases jobstate supports, MariaDB and MySQL.
    return not connection.features.supports_partial_indexes


def add_guards(apps, schema_editor):
    connection = schema_editor.connection
    if not _ignores_constraint_conditions(connection):
        return
    for table, column, definition, index, columns in GUARDS:
        schema_editor.execute(
            f"ALTER TABLE `{table}` ADD COLUMN `{column}` "
            + definition.format(nopad=_nopad_binary(connection))
        )
        schema_editor.execute(f"CREATE UNIQUE INDEX `{index}` ON `{table}` ({columns})")
    schema_editor.execute(
        f"CREATE TABLE `{THREAD_GATE}` (`thread_id` BIGINT NOT NULL PRIMARY KEY) ENGINE=InnoDB"
    )
    for table, index, columns in INDEXES:
        schema_editor.execute(f"CREATE INDEX `{index}` ON `{table}` ({columns})")


def drop_guards(apps, schema_editor):
    if not _ignores_constraint_conditions(schema_editor.connection):
        return
    for table, index, _columns in INDEXES:
        schema_editor.execute(f"DROP INDEX `{index}` ON `{table}`")
    schema_editor.execute(f"DROP TABLE `{THREAD_GATE}`")
    for table, column, _definition, index, _columns in GUARDS:
        schema_editor.execute(f"DROP INDEX `{index}` ON `{table}`")
        schema_editor.execute(f"ALTER TABLE `{table}` DROP COLUMN `{column}`")


class Migration(migrations.Migration):

    dependencies = [
        ("jobstate", "0008_schedules"),
    ]

    # Not atomic: MariaDB and MySQL cannot roll DDL back, and Django refuses DDL in a
    # transaction there.
    operations = [migrations.RunPython(add_guards, drop_guards, atomic=False, elidable=False)]
