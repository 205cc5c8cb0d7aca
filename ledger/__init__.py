"""The ledger: the one package that writes window counters, reservations, holds and usage
records (docs/architecture.md, "Apps and layers"; docs/decisions.md, 2026-12-01).

Apps above it (gateway, usage's alerts and tasks, budgets' services) call its functions; the
rows it writes are models of `budgets` and `usage`, which sit below it.
"""
