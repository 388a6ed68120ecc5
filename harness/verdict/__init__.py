"""The verdict stage: profiles (what to expect of each lab on which hardware), the reference loops,
and the verdicts reached from the samples of a grade. Pure functions of data: imports the base
modules, the run stage (request types) and observe; never report or commands."""
