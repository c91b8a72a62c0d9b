"""Failures of a command, each with the exit code scripts can rely on (see ``main``)."""

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_AUTH = 3
EXIT_INVALID = 4
EXIT_NOT_FOUND = 5
EXIT_UNREACHABLE = 6


class CliError(Exception):
    """A failure reported as one message on stderr; ``exit_code`` says which kind."""

    exit_code = EXIT_FAILED


class UsageError(CliError):
    """Bad local input: a missing or malformed spec file, a bad ``--set``."""

    exit_code = EXIT_USAGE


class AuthError(CliError):
    """Not logged in, or the server rejected the token (401)."""

    exit_code = EXIT_AUTH


class NotFoundError(CliError):
    """404, or 403: the object is missing or not yours to see or change."""

    exit_code = EXIT_NOT_FOUND


class UnreachableError(CliError):
    """No answer from the server: refused connection, DNS failure, timeout."""

    exit_code = EXIT_UNREACHABLE


class ApiValidationError(CliError):
    """400: ``errors`` maps each dotted field name to its messages."""

    exit_code = EXIT_INVALID

    def __init__(self, errors: dict[str, list[str]]):
        super().__init__("The server rejected the request.")
        self.errors = errors


def flatten_errors(detail: object, prefix: str = "") -> dict[str, list[str]]:
    """DRF error bodies, nested or already dotted, as ``{"a.b": ["message", …]}``."""
    if isinstance(detail, dict):
        flat: dict[str, list[str]] = {}
        for key, value in detail.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            for field, messages in flatten_errors(value, name).items():
                flat.setdefault(field, []).extend(messages)
        return flat
    if isinstance(detail, list):
        if all(isinstance(item, str) for item in detail):
            return {prefix: list(detail)} if detail else {}
        flat = {}
        for index, item in enumerate(detail):
            name = f"{prefix}.{index}" if isinstance(item, dict | list) else prefix
            for field, messages in flatten_errors(item, name).items():
                flat.setdefault(field, []).extend(messages)
        return flat
    return {prefix: [str(detail)]}
