# The cluster, node, cluster-flavor and simulated-job models, moved here from the jobs app.
# Their tables already exist (created by jobs' migrations, under the jobs_* names they keep):
# this creates the models in Django's state only, and hands their content types (so their
# permissions and admin log entries) over from jobs to clusters. jobs 0017 then forgets them.

import django.core.validators
import django.db.models.deletion
from django.db import migrations, models

MODELS = ("cluster", "clusternode", "clusterflavor", "simulatedjob")


def _content_types_move(apps, *, source: str, target: str) -> None:
    content_type = apps.get_model("contenttypes", "ContentType")
    for model in MODELS:
        # A fresh database has none yet (they are created after migrating); where the target
        # already exists, the source is left for remove_stale_contenttypes.
        if not content_type.objects.filter(app_label=target, model=model).exists():
            content_type.objects.filter(app_label=source, model=model).update(app_label=target)


def content_types_to_clusters(apps, schema_editor) -> None:
    _content_types_move(apps, source="jobs", target="clusters")


def content_types_to_jobs(apps, schema_editor) -> None:
    _content_types_move(apps, source="clusters", target="jobs")


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ("jobs", "0016_i31_wait_reasons_and_start_estimates"),
        ("tenants", "0008_i31_invitation"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="Cluster",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        (
                            "name",
                            models.SlugField(
                                max_length=63,
                                unique=True,
                                validators=[
                                    django.core.validators.RegexValidator(
                                        "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$",
                                        "Use 1-63 lowercase letters, digits and dashes, starting and ending with a letter or digit.",
                                    )
                                ],
                            ),
                        ),
                        (
                            "backend",
                            models.CharField(
                                choices=[
                                    ("simulator", "Simulator"),
                                    ("kubernetes", "Kubernetes"),
                                    ("slurm", "Slurm"),
                                ],
                                max_length=16,
                            ),
                        ),
                        ("settings", models.JSONField(blank=True, default=dict)),
                        ("enabled", models.BooleanField(default=True)),
                        ("last_sync_at", models.DateTimeField(blank=True, null=True)),
                        ("last_error", models.TextField(blank=True)),
                        ("inventory_at", models.DateTimeField(blank=True, null=True)),
                        ("inventory_valid_until", models.DateTimeField(blank=True, null=True)),
                        ("inventory_error", models.TextField(blank=True)),
                        ("topology_levels", models.JSONField(blank=True, default=list)),
                        ("inventory_problems", models.JSONField(blank=True, default=list)),
                        ("outside_claims", models.JSONField(blank=True, default=dict)),
                    ],
                    options={
                        "db_table": "jobs_cluster",
                        "ordering": ["name"],
                    },
                ),
                migrations.CreateModel(
                    name="ClusterFlavor",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("nodes", models.PositiveIntegerField()),
                        ("gpus_per_node", models.PositiveIntegerField()),
                        ("gpus", models.PositiveIntegerField()),
                        (
                            "cluster",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="flavors",
                                to="clusters.cluster",
                            ),
                        ),
                        (
                            "flavor",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="+",
                                to="tenants.gpuflavor",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "jobs_clusterflavor",
                        "ordering": ["cluster__name", "flavor__slug"],
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("cluster", "flavor"), name="cluster_flavor_unique"
                            )
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="ClusterNode",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("name", models.CharField(max_length=253)),
                        ("gpus", models.PositiveIntegerField()),
                        ("gpus_used", models.PositiveIntegerField(default=0)),
                        ("gpus_used_by_gantry", models.PositiveIntegerField(default=0)),
                        ("schedulable", models.BooleanField(default=True)),
                        ("reason", models.CharField(blank=True, max_length=500)),
                        (
                            "path",
                            models.JSONField(
                                blank=True, default=list, help_text="Topology domains, widest first"
                            ),
                        ),
                        ("updated_at", models.DateTimeField()),
                        (
                            "cluster",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="nodes",
                                to="clusters.cluster",
                            ),
                        ),
                        (
                            "flavor",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="+",
                                to="tenants.gpuflavor",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "jobs_clusternode",
                        "ordering": ["cluster__name", "name"],
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("cluster", "name"), name="cluster_node_unique"
                            )
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="SimulatedJob",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("name", models.CharField(max_length=100, unique=True)),
                        ("flavor", models.CharField(max_length=63)),
                        ("nodes", models.PositiveIntegerField()),
                        ("gpus_per_node", models.PositiveIntegerField()),
                        ("profile", models.JSONField(default=dict)),
                        ("max_runtime_s", models.PositiveIntegerField()),
                        ("state", models.CharField(default="PENDING", max_length=12)),
                        (
                            "allocation",
                            models.JSONField(
                                blank=True, default=dict, help_text="node -> GPU indices"
                            ),
                        ),
                        (
                            "placement",
                            models.JSONField(
                                blank=True, default=list, help_text="The nodes to start on"
                            ),
                        ),
                        ("submitted_at", models.DateTimeField()),
                        ("started_at", models.DateTimeField(blank=True, null=True)),
                        ("finished_at", models.DateTimeField(blank=True, null=True)),
                        ("cancelled_at", models.DateTimeField(blank=True, null=True)),
                        ("exit_code", models.IntegerField(blank=True, null=True)),
                        ("failure_reason", models.CharField(blank=True, max_length=16)),
                        ("message", models.TextField(blank=True)),
                        (
                            "cluster",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="+",
                                to="clusters.cluster",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "jobs_simulatedjob",
                        "indexes": [
                            models.Index(fields=["cluster", "state"], name="simjob_cluster_state")
                        ],
                    },
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(content_types_to_clusters, content_types_to_jobs),
    ]
