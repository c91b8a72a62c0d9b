"""The wire between a job and the portal: the endpoints, the limits of a batch, and
the one POST every report goes through (no redirects followed, never raises)."""

from __future__ import annotations

import contextlib
import logging
import urllib.error
import urllib.request

SDK_VERSION = "0.1.0"

EVENTS_PATH = "/attempts/events/"
REPORT_PATH = "/attempts/report/"
RANK_REPORT_PATH = "/attempts/rank-report/"

# Wire limits of one batch (docs/sdk.md): the server may refuse anything larger.
MAX_BATCH_EVENTS = 500
MAX_BATCH_BYTES = 256 * 1024

logger = logging.getLogger("gantry_sdk")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is answered as the error it is for us: following it would carry the
    token's header to wherever the redirect points."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def post(url, token, body, timeout):
    """POST ``body`` (bytes of JSON); return ``(status, retry_after_seconds)``.

    Never raises. Status 0 means the request did not get an HTTP answer (refused,
    timed out, DNS…). Nothing here mentions the token: it travels in a header only.
    """
    request = urllib.request.Request(  # noqa: S310 (the scheme is checked in Reporter)
        url,
        data=body,
        method="POST",
        headers={
            "Authorization": "Attempt " + token,
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": "gantry-sdk/" + SDK_VERSION,
        },
    )
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            response.read(65536)
            return response.status, None
    except urllib.error.HTTPError as exc:
        retry_after = None
        with contextlib.suppress(TypeError, ValueError, AttributeError):
            retry_after = float(exc.headers.get("Retry-After", ""))
        try:
            exc.read(65536)
            exc.close()
        except Exception:  # noqa: S110 (closing an error body is best-effort)
            pass
        return exc.code, retry_after
    except Exception as exc:
        logger.debug("gantry_sdk: POST %s failed: %s", url, type(exc).__name__)
        return 0, None


def retryable(status):
    return status == 0 or status in (408, 425, 429) or status >= 500


def url_ok(url):
    return url.startswith(("http://", "https://")) and not any(c.isspace() for c in url)


def token_ok(token):
    # A header value: printable ASCII without spaces (the server splits on whitespace).
    return bool(token) and all(33 <= ord(c) < 127 for c in token)
