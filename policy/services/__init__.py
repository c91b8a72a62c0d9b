"""Every change to what-if reports: asking for one, cancelling, sharing, running it again
(``reports``), replaying it (``replaying``, what the task calls) and applying its proposal
(``applying``)."""
