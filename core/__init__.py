"""The ground floor every app stands on: the web and API edge's helpers (``http``, ``forms``,
``api``, ``parsers``), the shared types, the id limits, the log context and the portal's own
metrics. No models, and no import of any app of Gantry's."""
