"""Hooks for the OpenAPI schema (drf-spectacular)."""

BAD_REQUEST = {
    "description": (
        "The request is malformed, for example it names a host (Host header) this deployment "
        "does not serve: Django refuses it before any endpoint sees it."
    )
}


def every_operation_may_answer_400(result, generator, request, public):
    """Every operation documents 400: a request with a bad Host header is refused with it
    by Django's middleware, whatever the endpoint (found by the API fuzzing test)."""
    for path in result.get("paths", {}).values():
        for operation in path.values():
            if isinstance(operation, dict) and "responses" in operation:
                operation["responses"].setdefault("400", BAD_REQUEST)
    return result
