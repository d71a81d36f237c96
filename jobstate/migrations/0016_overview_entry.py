# The console's dashboard is the Overview page: its entry among the admin's models is
# renamed with it (a proxy, so no table changes; the content type follows the rename).

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("jobstate", "0015_occurrence_result_index"),
    ]

    operations = [
        migrations.RenameModel(old_name="OperationsDashboard", new_name="Overview"),
        migrations.AlterModelOptions(
            name="overview",
            options={
                "default_permissions": (),
                "verbose_name": "overview",
                "verbose_name_plural": "overview",
            },
        ),
    ]
