"""Benchmarks that print ratios measured side by side in one run (`distlab bench NAME`): the training
path (train.py), the all-reduce bench (allreduce.py), the speed verdict under load (verdict.py), the
grader's robustness sweep (robustness.py), a class graded side by side (grade_class.py); load.py makes
a busy machine on purpose."""
