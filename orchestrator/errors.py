"""The exceptions a user of the orchestrator can cause (unknown sweep, a sweep that cannot finish, a bad request).

Their message says what to fix in one line; the CLI registers them as user errors and the API maps them to a 4xx:
`NotFoundError` to 404, `ConflictError` to 409, any other `OrchestratorError` to 422.
"""


class OrchestratorError(ValueError):
    """A request the orchestrator cannot honour as given; the message names the sweep or segment at fault."""


class NotFoundError(OrchestratorError):
    """The store holds no sweep or segment by that id."""


class ConflictError(OrchestratorError):
    """The sweep or segment is in a state that does not allow it now (a segment running); trying later may work."""
