"""DCGM exporter output, plain data in and out: parse the Prometheus text exposition
(``parsing``), map samples to attempts (``mapping``), roll them up per attempt, GPU and
minute (``rollups``), and all three in one pass, as the collector runs them
(``ingestor``). Timestamps are Unix milliseconds, as in the exposition format.

Import from the module itself (``from telemetry.exposition.ingestor import Ingestor``);
this package re-exports nothing."""
