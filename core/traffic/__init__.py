"""Recorded traffic: real runs read back, replayed through the guards, and measured.

Trajectories (:mod:`~loopwarden.traffic.trajectory`: the JSONL format of docs/contracts.md),
replay and its figures (:mod:`~loopwarden.traffic.replay`, :mod:`~loopwarden.traffic.figures`),
calibration and its corpus (:mod:`~loopwarden.traffic.calibrate`,
:mod:`~loopwarden.traffic.corpus`), and the settings offline runs share
(:mod:`~loopwarden.traffic.offline`).

May import: the public vocabulary, the engine (a replay drives the same step machine), the
models and the store.  Never the commands, the demo, the adapters, the reports, the docs
generator or the test kit; the engine never imports this package.
"""
