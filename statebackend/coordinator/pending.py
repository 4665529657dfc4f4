"""Completing what the partitions published: the driver's catch-up after every micro-batch
(the listener), at a restart's planning and by hand (``backend.complete()``)."""

from __future__ import annotations

from ..metrics_store import record_checkpoint

__all__ = ["complete_pending"]


def complete_pending(coordinator, up_to: int | None = None, run_id: str | None = None,
                     carry=None) -> list:
    """Complete, in order, every checkpoint after the latest completed one that all
    partitions have published (a driver that crashed or missed events catches up here).

    Spark runs no task of the operator in a micro-batch whose input is empty as planned
    (an empty file, a no-data batch: the optimizer prunes the plan), so such a checkpoint
    id has nothing published. Given ``up_to``, a batch id Spark has finished, such ids are
    passed over; a later checkpoint is still completed only once every partition published
    it, which proves Spark committed the batches before it.

    Checkpoints up to ``up_to`` are recorded as committed by Spark; without it (planning a
    restart, a query's end, a call by hand) Spark may still run the latest micro-batch
    again, so retention keeps the checkpoint before it too (see
    :meth:`~statebackend.coordinator.CheckpointCoordinator.try_complete`).
    """
    if run_id is not None and not coordinator.owns(run_id):
        # the run never held an epoch here (its tasks were refused): it completes, carries
        # (publishes carried manifests) and deletes nothing in another query's location
        return []
    done = []
    latest = coordinator.latest()
    if (latest is not None and up_to is not None and not latest.committed
            and latest.checkpoint_id <= up_to):
        coordinator.try_complete(latest.checkpoint_id, committed=True, run_id=run_id)
    n = 0 if latest is None else latest.checkpoint_id + 1
    while True:
        if up_to is not None and n > up_to:
            # Spark has not finished that batch: trying it would cost a listing of its
            # directory (and reads of the manifests published so far) every micro-batch
            break
        record = coordinator.try_complete(n, committed=up_to is not None, run_id=run_id)
        if record is None and carry is not None and up_to is not None and carry(coordinator, n):
            # Spark committed n: the carrier's partitions without rows ran no task in it
            # (statebackend.restore.carry), and now have their carried checkpoints; or n
            # was the previous run's last, which the carry completed in that run's layout
            now = coordinator.latest()
            record = now if now is not None and now.checkpoint_id == n else \
                coordinator.try_complete(n, committed=True, run_id=run_id)
        if record is None:
            if up_to is not None and n < up_to and not coordinator.anything_published(n):
                n += 1
                continue
            break
        done.append(record)
        # aggregated, written beside the checkpoint and logged once; never raises
        record_checkpoint(coordinator.store, record, coordinator.chosen_manifests(n),
                          coordinator.last_completion_requests)
        n += 1
    return done
