# The cluster, node, cluster-flavor and simulated-job models moved to the clusters app
# (clusters/migrations/0001_initial.py), keeping their jobs_* tables: the runs' and attempts'
# foreign keys point to them there, and jobs' state forgets them. Django's state only; no
# table, column, row or id changes. It runs after the other apps' foreign keys moved
# (finance 0003, telemetry 0005), so no state ever points to a model that is gone.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("clusters", "0001_initial"),
        ("finance", "0003_s3_cluster_moved_to_clusters"),
        ("jobs", "0016_i31_wait_reasons_and_start_estimates"),
        ("telemetry", "0005_s3_cluster_moved_to_clusters"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="attempt",
                    name="cluster",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="attempts",
                        to="clusters.cluster",
                    ),
                ),
                migrations.AlterField(
                    model_name="run",
                    name="cluster",
                    field=models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="runs",
                        to="clusters.cluster",
                    ),
                ),
                migrations.RemoveField(
                    model_name="clusternode",
                    name="cluster",
                ),
                migrations.RemoveField(
                    model_name="clusterflavor",
                    name="cluster",
                ),
                migrations.RemoveField(
                    model_name="clusterflavor",
                    name="flavor",
                ),
                migrations.RemoveField(
                    model_name="clusternode",
                    name="flavor",
                ),
                migrations.DeleteModel(
                    name="SimulatedJob",
                ),
                migrations.DeleteModel(
                    name="Cluster",
                ),
                migrations.DeleteModel(
                    name="ClusterFlavor",
                ),
                migrations.DeleteModel(
                    name="ClusterNode",
                ),
            ],
            database_operations=[],
        ),
    ]
