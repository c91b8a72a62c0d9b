"""A run's verdicts over the REST API: the troubleshooting tree of every attempt, with each
verdict's figures and next step, and the signals that were missing (issue 36, point 3)."""

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api import NOT_FOUND, UNAUTHENTICATED
from core.http import or_404
from jobs.selectors.runs import run_attempts, run_get_viewable
from telemetry.selectors.run_page import attempt_items

ID = OpenApiParameter("id", {"type": "integer", "minimum": 1}, OpenApiParameter.PATH)


class VerdictSerializer(serializers.Serializer):
    code = serializers.CharField(help_text="input_bound, slow_rank, placement_spread, …")
    text = serializers.CharField(help_text="The verdict with its figures and the next step")
    numbers = serializers.DictField(help_text="The figures, by name")
    node = serializers.CharField(help_text="The node to act on, when it names one")


class AttemptVerdictsSerializer(serializers.Serializer):
    attempt = serializers.IntegerField(help_text="The attempt's number in its run")
    state = serializers.CharField()
    status = serializers.CharField(
        help_text="accounted, pending (accounting follows), running or waiting"
    )
    verdicts = VerdictSerializer(many=True, allow_null=True, help_text="null before it started")
    missing = serializers.ListField(
        child=serializers.CharField(), help_text="Signals a branch of the tree did not have"
    )


class RunVerdictsSerializer(serializers.Serializer):
    run = serializers.IntegerField()
    attempts = AttemptVerdictsSerializer(many=True)


@extend_schema(tags=["runs"])
class RunVerdictsApi(APIView):
    @extend_schema(
        parameters=[ID],
        responses={200: RunVerdictsSerializer, 401: UNAUTHENTICATED, 404: NOT_FOUND},
    )
    def get(self, request, id: int):
        """Why each attempt of the run was slow or failed, and what to do next."""
        run = or_404(run_get_viewable, user=request.user, run_id=id)
        items = attempt_items(run=run, attempts=list(run_attempts(run=run)), now=timezone.now())
        body = {
            "run": run.pk,
            "attempts": [
                {
                    "attempt": item.attempt.number,
                    "state": item.attempt.state,
                    "status": item.status,
                    "verdicts": None
                    if item.verdicts is None
                    else [
                        {
                            "code": finding.code.value,
                            "text": finding.text,
                            "numbers": dict(finding.numbers),
                            "node": finding.node,
                        }
                        for finding in item.verdicts.findings
                    ],
                    "missing": list(item.verdicts.missing) if item.verdicts else [],
                }
                for item in items
            ],
        }
        return Response(RunVerdictsSerializer(body).data)
