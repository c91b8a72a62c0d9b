"""The workspace proxy: an aiohttp server beside Django that relays a workspace's HTTP and
WebSocket traffic to the address its backend reported, for its owner only
(docs/workspaces.md, "The proxy"). Run it with ``python -m portal.workspace_proxy``."""
