"""The id limits of the edge: ids are bigint, so anything larger can only be a mistake (and
would make PostgreSQL fail)."""

MAX_ID = 2**63 - 1
