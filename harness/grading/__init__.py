"""The grading stage: a plan built from a profile, executed through the runner, judged into verdicts.

    plan.plan_grade     profile, rows, world sizes, repeats, programs, results folder, GPUs -> GradePlan
    execute.execute     every cell's runs, each beside its reference runs, observed (samples.py)
    judge.judge         verdicts from runs, however they were got (stored ones too: no host check)
    judge.run_grade     execute then judge, a stop kept as a verdict: a Grade

`distlab grade`, `calibrate`, `grade --slurm`, `grade-class` and the replay test call these with typed
arguments; none of them builds a command line. Reports are the commands' (harness/report/).
"""
