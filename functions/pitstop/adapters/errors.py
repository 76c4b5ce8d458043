"""How actuator failures are classified: retry later, or stop and call a human."""

from __future__ import annotations

from google.api_core import exceptions as gexc


class ActuatorError(Exception):
    """A failure with the HTTP status actuate should answer (429/503 retried by the workflow)."""

    def __init__(self, status: int, message: str, retryable: bool) -> None:
        super().__init__(message)
        self.status, self.message, self.retryable = status, message, retryable


def from_google(exc: gexc.GoogleAPICallError, what: str) -> ActuatorError:
    """Transient (429, 5xx, timeouts, Compute's 403 rateLimitExceeded) vs. permanent (other 4xx)."""
    reasons = {e.get("reason") for e in (exc.errors or []) if isinstance(e, dict)}
    text = str(exc)
    if isinstance(exc, gexc.Forbidden) and (
        reasons & {"rateLimitExceeded", "userRateLimitExceeded", "RESOURCE_OPERATION_RATE_EXCEEDED"}
        or "Rate Limit Exceeded" in text
    ):
        return ActuatorError(429, f"{what}: rate limited by Compute Engine ({text[:200]})", True)
    if isinstance(
        exc,
        gexc.TooManyRequests
        | gexc.ServiceUnavailable
        | gexc.InternalServerError
        | gexc.GatewayTimeout
        | gexc.DeadlineExceeded
        | gexc.BadGateway,
    ):
        return ActuatorError(503, f"{what}: transient error ({text[:200]})", True)
    code = exc.code if isinstance(exc.code, int) else 500
    return ActuatorError(code if 400 <= code < 500 else 500, f"{what}: {text[:300]}", False)
