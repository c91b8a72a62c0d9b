"""The workspace proxy as Django's settings configure it."""

from collections.abc import AsyncIterator

from aiohttp import web
from django.conf import settings

from portal.workspace_proxy import rules
from portal.workspace_proxy.gate import DjangoGate
from portal.workspace_proxy.relay import ProxyConfig, make_app

CONNECT_TIMEOUT_S = 10.0


def proxy_config() -> ProxyConfig:
    public_origin = rules.origin_of(settings.GANTRY_WORKSPACE_URL)
    assert public_origin is not None, "the settings check GANTRY_WORKSPACE_URL"
    return ProxyConfig(
        public_origin=public_origin,
        session_cookie=settings.SESSION_COOKIE_NAME,
        portal_cookies=frozenset(
            {settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME, settings.LANGUAGE_COOKIE_NAME}
        ),
        max_body_bytes=settings.GANTRY_WORKSPACE_MAX_UPLOAD_MB * 1024 * 1024,
        connect_timeout_s=CONNECT_TIMEOUT_S,
        read_timeout_s=float(settings.GANTRY_WORKSPACE_UPSTREAM_TIMEOUT_S),
    )


def proxy_app(config: ProxyConfig | None = None, gate: DjangoGate | None = None) -> web.Application:
    """The proxy's application; its gate's threads and connections end with it."""
    used_gate = gate or DjangoGate()
    app = make_app(config or proxy_config(), used_gate)

    async def gate_lifetime(app: web.Application) -> AsyncIterator[None]:
        yield
        await used_gate.close()

    app.cleanup_ctx.append(gate_lifetime)
    return app
