"""Readers of stored state, on the driver or in a task: :mod:`.views` (what a checkpoint or
savepoint holds and how a unit is opened), :mod:`.rows` (its entries decoded into rows),
:mod:`.changes` (the change feed between two checkpoints) and :mod:`.arrow` (typed Arrow
and Parquet output). No session API: :mod:`statebackend.spark.readers` turns them into
Spark DataFrames.
"""
