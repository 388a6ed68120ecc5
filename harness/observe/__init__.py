"""The observe stage: what the ranks did, read from what the observer left in a run's observe/
folder, and the accuracy of rank 0's final weights, measured in a process of its own. Imports the
base modules and the run stage's names; never verdict, report or commands."""
