"""The error hierarchy of statebackend.

Every error the package raises on purpose derives from :class:`StateBackendError`, so a
caller can catch "anything statebackend refused". Subclasses also inherit the builtin
exception they refine (``ValueError``, ``OSError``, ...), so existing ``except`` clauses
keep working. Messages say what was expected, what was found, and what to do.

Errors the state API raises into user code (:class:`StateError`, :class:`SchemaError`) are
also instances of the class PySpark raises in the same situation: Spark's own state clients
raise ``PySparkRuntimeError`` for every failed state call, so a processor written for
``transformWithStateInPandas`` that catches it (or ``PySparkException``) keeps working on
this backend. That is the one reason this module imports ``pyspark.errors`` (light: no JVM,
no session); every other use of pyspark lives in :mod:`statebackend.spark`.
"""

from __future__ import annotations

from pyspark.errors import PySparkRuntimeError, PySparkTypeError

from .redact import redact_text


class StateBackendError(Exception):
    """Root of every error raised by statebackend.

    Its message never shows URL credentials: a message that quotes a location (or a
    filesystem root derived from one) has ``user:secret@`` redacted to ``user:***@``.
    """

    def __str__(self) -> str:
        return redact_text(super().__str__())

    def __repr__(self) -> str:
        return redact_text(super().__repr__())


# --- configuration -----------------------------------------------------------------


class OptionsError(StateBackendError, ValueError):
    """An option has an unknown name, a wrong type or a value out of range.

    Attributes
    ----------
    key : str
        The option's name as the user wrote it.
    value : object
        The value that was refused.
    """

    def __init__(self, key: str, value: object, message: str) -> None:
        super().__init__(message)
        self.key = key
        self.value = value


class UnknownOptionError(OptionsError, KeyError):
    """An option name that does not exist (often a typo; the message suggests a fix)."""

    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return redact_text(self.args[0])


class IncompatibleStateError(StateBackendError, ValueError):
    """Existing state cannot be used as configured (e.g. ``max_parallelism`` changed)."""


class FormatVersionError(IncompatibleStateError):
    """A file (or stored entry) written in an earlier, pre-release format of this package,
    which this version no longer reads (see docs/formats.md, "Format versions").

    Attributes
    ----------
    path : str
        What was read (a durable or local path, or an entry of the state's ``_meta``).
    found, expected : object
        The format version found and the one this version reads.
    """

    def __init__(self, path: str, what: str, found: object, expected: object) -> None:
        super().__init__(
            f"{path}: {what} format {found!r} was written by a pre-release version of "
            f"statebackend; this version reads format {expected!r} only. Recreate the state "
            f"(run the query from a new checkpoint location), or read it with the version "
            f"that wrote it")
        self.path = path
        self.found = found
        self.expected = expected


# --- state API ---------------------------------------------------------------------


class StateError(StateBackendError, PySparkRuntimeError):
    """Misuse of the state API (no current key, unknown state, wrong value shape).

    A ``pyspark.errors.PySparkRuntimeError`` too, as Spark's own state calls raise.
    """


class SchemaError(StateError, PySparkTypeError):
    """A value does not match the schema declared for its state.

    Also a ``PySparkTypeError`` (and so a ``TypeError``).
    """


class SchemaEvolutionError(SchemaError):
    """A state's new declaration cannot read the values stored under an earlier schema
    (narrowing, a changed map key, an added NOT NULL field...). Raised when the state is
    declared, before anything is written.

    Attributes
    ----------
    state : str
        The state's name.
    field : str
        Path of the field (``a.b``, ``a.element``, ``m.value``; ``""`` for the state).
    change : str
        What changed, e.g. ``"narrowing BIGINT to INT"``.
    """

    def __init__(self, state: str, field: str, change: str, remedy: str) -> None:
        where = f"field {field!r} of " if field else ""
        super().__init__(f"{where}state {state!r}: {change} is not a compatible schema "
                         f"change (values stored under the earlier schema could not be "
                         f"read). {remedy}")
        self.state = state
        self.field = field
        self.change = change


# --- event time ------------------------------------------------------------------


class LateOutputError(StateBackendError, RuntimeError):
    """An operator chained on ``eventTimeColumnName`` emitted a row at or before the
    watermark for late events, which the stateful operators after it would drop or
    miscount. The message starts with Spark's error condition
    (``EMITTING_ROWS_OLDER_THAN_WATERMARK_NOT_ALLOWED``) and text, as Spark's query fails
    with it when its own operator emits such a row.

    Attributes
    ----------
    column : str
        The event-time column of the output.
    event_time_us : int
        The row's event time (microseconds since the epoch, as Spark reports it).
    watermark_ms : int
        The watermark it was compared with (milliseconds since the epoch).
    """

    CONDITION = "EMITTING_ROWS_OLDER_THAN_WATERMARK_NOT_ALLOWED"

    def __init__(self, column: str, event_time_us: int, watermark_ms: int, where: str) -> None:
        super().__init__(
            f"[{self.CONDITION}] Previous node emitted a row with eventTime={event_time_us} "
            f"which is older than current_watermark_value={watermark_ms}\n"
            f"This can lead to correctness issues in the stateful operators downstream in "
            f"the execution pipeline.\n"
            f"Please correct the operator logic to emit rows after current global watermark "
            f"value. SQLSTATE: 42815 (statebackend: {where} emitted {column}={event_time_us} "
            f"us, at or before the watermark {watermark_ms} ms of the previous micro-batch; "
            f"emit rows whose {column!r} is later than the watermark the processor sees)")
        self.column = column
        self.event_time_us = event_time_us
        self.watermark_ms = watermark_ms


# --- storage and checkpoints -------------------------------------------------------


class StorageError(StateBackendError, OSError):
    """Durable storage failed (after retries) or holds something unexpected."""


class FencingUnsupportedError(StorageError):
    """The durable store offers no compare-and-set (an atomic create-if-absent), so one
    writer per state location cannot be enforced; ``fencing=False`` opts out."""


class TransientStorageError(StorageError):
    """A storage failure worth retrying (timeouts, throttling, connection resets)."""


class ChecksumMismatchError(StorageError):
    """A file read back from durable storage has another size or CRC32 than what refers to
    it records: the stored file is damaged. Not retried (reading it again returns the same
    bytes); a restore tries its local copy first and then fails naming the file.

    Attributes
    ----------
    path : str
        The file, relative to the store's root.
    """

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class UnsafePathError(StorageError, ValueError):
    """A path (e.g. from a manifest) would escape the checkpoint root."""


class CheckpointError(StateBackendError):
    """A checkpoint could not be taken or published."""


class CommitFailedError(CheckpointError):
    """A commit's precondition did not hold (another attempt won, base changed).

    The single retryable error of the commit protocol.
    """


class WriterFencedError(CheckpointError, RuntimeError):
    """A newer run of the same query took over this state location: this writer (a
    zombie driver, or a task of the older run) must stop before it publishes or deletes.

    Attributes
    ----------
    newer : object
        The :class:`~statebackend.checkpoint.fencing.WriterEpoch` that owns the location.
    """

    def __init__(self, message: str, *, newer: object = None) -> None:
        super().__init__(message)
        self.newer = newer


class StateLocationInUseError(IncompatibleStateError):
    """Another streaming query owns this state location; the query that asked is refused
    at its start and the owner runs on undisturbed.

    Attributes
    ----------
    owner : object
        The :class:`~statebackend.checkpoint.fencing.WriterEpoch` of the owning query.
    """

    def __init__(self, message: str, *, owner: object = None) -> None:
        super().__init__(message)
        self.owner = owner


class MoveRefusedError(IncompatibleStateError):
    """A move was refused before anything was written. To the carrier plan
    (:func:`statebackend.savepoint.move.move_to_carrier`): the location already uses the
    carrier, or the new state location is the old one or already holds state of the
    operator. From Spark's state store
    (:func:`statebackend.spark.import_spark.import_spark_state`): the Spark operator is
    not a transformWithState one, or the operator already has checkpoints here."""


class RestoreError(StateBackendError):
    """State could not be restored; committed state in durable storage is untouched."""


class CheckpointNotFoundError(RestoreError, FileNotFoundError):
    """The requested checkpoint (or its manifest) does not exist."""


class CorruptStateError(RestoreError):
    """A durable file is missing, truncated, or fails its checksum.

    Attributes
    ----------
    checkpoint_id, partition, path
        Where the problem is, so an operator can find the file.
    """

    def __init__(self, message: str, *, checkpoint_id: int | None = None,
                 partition: int | None = None, path: str | None = None) -> None:
        super().__init__(message)
        self.checkpoint_id = checkpoint_id
        self.partition = partition
        self.path = path


class CorruptKeyGroupError(CorruptStateError):
    """One key-group block of a savepoint fails its checksum or cannot be decompressed."""

    def __init__(self, message: str, *, key_group: int, path: str | None = None) -> None:
        super().__init__(message, path=path)
        self.key_group = key_group


# --- failure handling ----------------------------------------------------------------


class RestartsExhaustedError(StateBackendError, RuntimeError):
    """The restart strategy gave up; ``__cause__`` is the last failure."""
