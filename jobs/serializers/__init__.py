"""Shapes of the runs API, one module per resource. Types only."""
