"""Reads of the finance pages and exports (design §8): the rate cards, monthly statements,
month-over-month trends, budget burn-down, the attempts behind a statement line and the rows
of an export. Who may read which tenant is ``finance.access``.

Every figure comes from ``DailyUsage``, the precomputed per-day rollup of attempt
accounting: a statement is one grouped query over one tenant's month, never a walk over
attempts. GPU time is kept in whole GPU-seconds; hours are Decimal GPU-seconds ÷ 3600.

Money follows one rule. A statement line is the GPU-seconds of one project, user, flavor
and cluster under one rate card in the month; its cost is those GPU-seconds × the card's
price, rounded once, half to even, to the cent (``costing.line_cost``), and so is its
effective cost. Every other figure (a breakdown line, a total, a month of the trend, an
export row) is a sum of such lines, so they all add up exactly.

One module per sub-area; import from the module itself
(``from finance.selectors.statements import statement_month``): this package re-exports
nothing.
"""
