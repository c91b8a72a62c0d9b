"""The platform KPI page (design §7): the pure arithmetic (``metrics``), the reads behind it
(``selectors``), its filters (``forms``) and the page (``views``)."""
