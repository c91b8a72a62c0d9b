"""``python -m portal.workspace_proxy [--host 127.0.0.1] [--port N]``: the workspace proxy
(docs/workspaces.md, "The proxy"); the port defaults to GANTRY_WORKSPACE_PROXY_PORT."""

import argparse
import logging
import os
import sys


def main(argv: list[str]) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    import django

    django.setup()
    from aiohttp import web
    from django.conf import settings

    from portal.workspace_proxy.server import proxy_app

    parser = argparse.ArgumentParser(prog="python -m portal.workspace_proxy")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=settings.GANTRY_WORKSPACE_PROXY_PORT)
    options = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    print(
        f"workspace proxy on http://{options.host}:{options.port}/w/<run id>/ "
        f"(browsers: {settings.GANTRY_WORKSPACE_URL})",
        flush=True,
    )
    web.run_app(
        proxy_app(),
        host=options.host,
        port=options.port,
        access_log=None,
        print=None,
        shutdown_timeout=5,  # open WebSockets are closed then, not waited for
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
