"""What the runs API's input serializers share."""

from collections.abc import Mapping
from typing import Any

from rest_framework import serializers


def reject_unknown(serializer: serializers.Serializer, data, parse):
    """Parse ``data``, reporting unknown keys by name along with every other error."""
    unknown = sorted(set(data) - set(serializer.fields)) if isinstance(data, Mapping) else []
    errors: dict[str, Any] = {}
    try:
        value = parse(data)
    except serializers.ValidationError as exc:
        assert isinstance(exc.detail, dict)  # a serializer's errors are by field
        errors = dict(exc.detail)
    errors.update({name: ["Unknown field."] for name in unknown})
    if errors:
        raise serializers.ValidationError(errors)
    return value
