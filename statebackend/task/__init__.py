"""The executor side: what one Spark task does for one partition of a stateful operator.

:mod:`.runner` runs a task (read the input, :class:`.partition_state.PartitionState`
load -> process -> commit -> release, emit); :mod:`.context` holds the operator's
configuration and the task's input; :mod:`.watermark`, :mod:`.metrics` and
:mod:`.metrics_rows` the event time and metrics of a task; :mod:`.processor`,
:mod:`.group_state` and :mod:`.vector` run the user's code against the keyed state.

Nothing here touches a Spark session (it runs in Python workers, where none exists, and
the same way under classic and Spark Connect drivers): ``tests/test_layers.py`` holds
that rule.
"""
