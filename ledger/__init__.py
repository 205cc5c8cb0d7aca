"""The ledger: the money rows (ledger/models.py: budgets, windows, reservations, holds, gateway
processes, usage records) and the one package that writes window counters, reservations, holds,
usage records and gateway processes (docs/architecture.md, "Apps and layers").

Apps above it (budgets' services, alerts, the gateway, jobs) call its functions and read its rows.
"""
