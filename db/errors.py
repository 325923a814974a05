"""Errors the tuning database raises. Every message names the database (URL with the password hidden)
or the file, and says what is wrong and, where there is one, what to do about it."""

from __future__ import annotations

from compiler.errors import KilnError


class DatabaseError(KilnError):
    """Base class of every tuning-database error."""


class InvalidURLError(DatabaseError):
    """A database URL that cannot be parsed or names a driver that is not installed."""


class DatabaseConnectionError(DatabaseError):
    """The database server cannot be reached or refused the connection."""


class DatabaseNotFoundError(DatabaseError):
    """A database that does not exist was opened with ``create=False``."""


class CorruptDatabaseError(DatabaseError):
    """The file is not a SQLite database or is damaged."""


class ReadOnlyDatabaseError(DatabaseError):
    """A write was attempted on a database opened (or only writable) read-only."""


class SchemaError(DatabaseError):
    """The database schema does not match what this version of Kiln expects."""


class SchemaTooOldError(SchemaError):
    """The database was made by an older Kiln: run ``kiln db upgrade --db URL``."""


class SchemaTooNewError(SchemaError):
    """The database was made by a newer Kiln; this version refuses to read or write it."""


class UnknownKeyError(DatabaseError):
    """A workload, target, model or run that is not in the database."""


class AmbiguousKeyError(DatabaseError):
    """A key prefix (target kind, short workload key) that matches more than one entry."""


class ConflictError(DatabaseError):
    """An existing key was committed again with different content (e.g. another canonical workload)."""


class InvalidRecordError(DatabaseError):
    """A record or a line of an import file that does not satisfy the record contract."""


class InvalidRecordWarning(UserWarning):
    """A stored record was skipped because its config is invalid for its sketch (see ``best``)."""
