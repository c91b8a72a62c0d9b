"""What ``POST /runs/simulate/`` answers: the submit preview of a spec, its other shapes
included (jobs.selectors.preview)."""

from rest_framework import serializers


class ShapeSerializer(serializers.Serializer):
    nodes = serializers.IntegerField(source="shape.nodes")
    gpus_per_node = serializers.IntegerField(source="shape.gpus_per_node")
    flavor = serializers.CharField(source="shape.flavor")
    topology_level = serializers.CharField(source="shape.topology_level")
    topology_mode = serializers.SerializerMethodField(
        help_text='"required", "preferred", or "" when no level is asked for.'
    )
    asked = serializers.BooleanField(help_text="The shape the spec asks for.")
    fastest = serializers.BooleanField(help_text="Starts first of them all (ties included).")
    starts_now = serializers.BooleanField(source="now")
    never = serializers.BooleanField(help_text="No quota or no cluster could ever hold it.")
    expected_start = serializers.DateTimeField(
        source="expected", allow_null=True, help_text="Null: no estimate; ``note`` says why."
    )
    full_limits_start = serializers.DateTimeField(
        source="full_limits",
        allow_null=True,
        help_text="If every run ahead uses its full time limit.",
    )
    note = serializers.CharField(help_text="Why there is no estimate.")
    start = serializers.CharField(help_text="The expected start as the submit page says it.")

    def get_topology_mode(self, row) -> str:
        if not row.shape.topology_level:
            return ""
        return "required" if row.shape.topology_required else "preferred"


class SimulationSerializer(serializers.Serializer):
    tenant = serializers.CharField()
    flavor = serializers.CharField()
    gpus = serializers.IntegerField()
    verdict = serializers.ChoiceField(
        choices=["start", "borrow", "wait", "cannot"],
        help_text='"cannot": the submit would be refused (``message`` says why).',
    )
    message = serializers.CharField()
    start = serializers.CharField(help_text="When it would start, if it would wait.")
    shapes = ShapeSerializer(
        many=True, help_text="The same run in other shapes (at most 8), fastest first."
    )
