"""core.schema: one validator for the strict JSON inputs, one error type naming the field."""

import math

import pytest

from clusters.backends import k8s_settings, slurm_settings
from core.schema import JsonSchema, SchemaError
from telemetry import sdk_events, source_settings

SCHEMA = JsonSchema(
    {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "partition": {"type": "string"},
            "gpus": {"type": "integer", "minimum": 1, "maximum": 8},
            "seconds": {"type": "number"},
            "users": {
                "type": "array",
                "items": {"type": "string"},
                "message": "$path: a list of user names, not $value",
            },
        },
        "allOf": [{"required": ["gpus"]}],
    }
)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"gpus": 1, "partition": 3}, "settings: partition: must be a string"),
        ({"gpus": 9}, "settings: gpus: must be from 1 to 8"),
        ({}, "settings: gpus: is required"),
        ({"gpus": 1, "colour": "blue", "size": 2}, "settings: unknown keys: colour, size"),
        ({"gpus": 1, "users": ["ann", 7]}, "settings: users[1]: a list of user names, not 7"),
        ([], "settings: must be an object"),
    ],
)
def test_the_first_error_names_the_field(value, message):
    with pytest.raises(SchemaError) as raised:
        SCHEMA.validate(value, where="settings: ")

    assert str(raised.value) == message
    assert isinstance(raised.value, ValueError)


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        ({"gpus": 2}, True),
        ({"gpus": 2.0}, False),  # an integer is an int, not a whole float
        ({"gpus": True}, False),
        ({"gpus": 1, "seconds": 1}, True),
        ({"gpus": 1, "seconds": math.nan}, False),  # a number is finite
        ({"gpus": 1, "seconds": math.inf}, False),
        ({"gpus": 1, "seconds": False}, False),
    ],
)
def test_integers_are_ints_and_numbers_are_finite(value, valid):
    assert SCHEMA.is_valid(value) is valid


def test_a_format_check_gives_the_reason():
    def even(value: object) -> bool:
        if isinstance(value, int) and value % 2:
            raise ValueError(f"is odd: {value}")
        return True

    schema = JsonSchema({"items": {"format": "even"}}, formats={"even": even})

    assert schema.error([2, 4]) is None
    assert str(schema.error([2, 3])) == "[1]: is odd: 3"


@pytest.mark.parametrize(
    "schema",
    [slurm_settings.SETTINGS, k8s_settings.SETTINGS, source_settings.SETTINGS, sdk_events.EVENT],
)
def test_every_schema_is_a_valid_draft_2020_12_schema(schema):
    schema.check_schema()
