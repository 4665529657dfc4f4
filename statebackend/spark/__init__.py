"""The driver side: everything that reaches a Spark session.

:mod:`.session` adapts classic and Spark Connect sessions; :mod:`.plan`,
:mod:`.operator_plan` and :mod:`.carrier` build an operator's plan; :mod:`.listener`
completes checkpoints when Spark finishes a micro-batch; :mod:`.progress` observes the
tasks' metrics; :mod:`.schema_check` refuses state schemas that cannot evolve;
:mod:`.readers` gives stored state as DataFrames; :mod:`.jvm` starts a classic session's
JVM detached from the terminal.
"""
