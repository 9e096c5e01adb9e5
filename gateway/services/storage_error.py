"""The one error both storage backends raise (`storage.py` chooses one, `postgres.py` is one), apart from
both so that neither imports the other's module for it."""


class StorageError(RuntimeError):
    """The database cannot be reached or refused a statement; the message says what to check."""
