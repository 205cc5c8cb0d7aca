"""The admission benchmark's parts (the program is bench/admission.py).

Before Django is set up: `base` (paths, runners, the database, Django setup). After it:
`tenant` (the hot organizations, the reset between cells), `cell` (a cell's measurements and
counter checks), `workers` (threads and processes admitting as the gateway does), `pgbench`
(the same SQL driven by pgbench), `leases`, `exhaustion` and `leases_report` (processes
admitting from headroom slices, the exhaustion run, their report), `whatif` (leaner engines, --whatif),
`profiling` (one admission's round trips and time), `report` (the tables) and `run` (the plan
of cells).
"""
