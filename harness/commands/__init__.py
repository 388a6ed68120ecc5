"""The commands: `distlab` (cli.py) and each verb that composes the stages (grade, calibrate, scale,
the benchmarks, ...). May import every stage; nothing below imports it."""
