"""Benchmarks (run as scripts, e.g. `python bench/admission.py`; see docs/performance.md)."""
