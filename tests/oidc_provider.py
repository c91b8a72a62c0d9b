"""A tiny OpenID Connect provider for tests, on 127.0.0.1, speaking real HTTP.

It implements what Gantry's login uses: discovery, ``/authorize`` (approves ``provider.user``
at once and redirects back with a code and the state), ``/token`` (checks the client's
secret, the redirect URI and the PKCE verifier, returns an RS256-signed ID token with the
nonce), ``/jwks`` and ``/userinfo``. Its RSA keys are generated with ``cryptography`` when it
starts. ``provider.tamper`` makes the next ID tokens wrong on purpose: ``"nonce"`` (another
nonce), ``"signature"`` (signed by a key the JWKS does not hold), ``"audience"``.

    with OidcProvider(client_id="gantry", client_secret="s3cret") as provider:
        provider.user = {"sub": "u-1", "preferred_username": "olga", "groups": ["ml"]}
        ... provider.issuer ...
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlencode, urlsplit

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

KEY_ID = "test-key-1"


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _uint(number: int) -> str:
    return b64url(number.to_bytes((number.bit_length() + 7) // 8, "big"))


def sign_jwt(claims: dict, key: rsa.RSAPrivateKey, kid: str = KEY_ID) -> str:
    header = {"alg": "RS256", "typ": "JWT", "kid": kid}
    signing_input = b64url(json.dumps(header).encode()) + "." + b64url(json.dumps(claims).encode())
    signature = key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
    return signing_input + "." + b64url(signature)


@dataclass
class Grant:
    """What an authorization code stands for until it is exchanged (once)."""

    client_id: str
    redirect_uri: str
    nonce: str | None
    code_challenge: str | None
    code_challenge_method: str | None
    claims: dict


@dataclass
class OidcProvider:
    client_id: str
    client_secret: str
    user: dict = field(default_factory=dict)
    tamper: str | None = None
    # What the provider saw, for assertions: every request path, and the parameters of
    # every authorization and token request.
    requests: list[str] = field(default_factory=list)
    authorizations: list[dict] = field(default_factory=list)
    token_requests: list[dict] = field(default_factory=list)

    def __post_init__(self):
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.codes: dict[str, Grant] = {}
        self.access_tokens: dict[str, dict] = {}
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> OidcProvider:
        provider = self

        class Handler(_Handler):
            pass

        Handler.provider = provider
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
            self._server = None

    def __enter__(self) -> OidcProvider:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def issuer(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    # --- documents ----------------------------------------------------------------------

    def discovery(self) -> dict:
        return {
            "issuer": self.issuer,
            "authorization_endpoint": f"{self.issuer}/authorize",
            "token_endpoint": f"{self.issuer}/token",
            "jwks_uri": f"{self.issuer}/jwks",
            "userinfo_endpoint": f"{self.issuer}/userinfo",
            "response_types_supported": ["code"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["client_secret_basic"],
        }

    def jwks(self) -> dict:
        numbers = self.key.public_key().public_numbers()
        return {
            "keys": [
                {
                    "kty": "RSA",
                    "use": "sig",
                    "alg": "RS256",
                    "kid": KEY_ID,
                    "n": _uint(numbers.n),
                    "e": _uint(numbers.e),
                }
            ]
        }

    def public_key_pem(self) -> bytes:
        return self.key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    # --- endpoints ----------------------------------------------------------------------

    def authorize(self, query: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        self.authorizations.append(dict(query))
        if query.get("client_id") != self.client_id or query.get("response_type") != "code":
            return 400, {}, b"unknown client or response type"
        code = secrets.token_urlsafe(24)
        with self._lock:
            self.codes[code] = Grant(
                client_id=query["client_id"],
                redirect_uri=query["redirect_uri"],
                nonce=query.get("nonce"),
                code_challenge=query.get("code_challenge"),
                code_challenge_method=query.get("code_challenge_method"),
                claims=dict(self.user),
            )
        back = query["redirect_uri"] + "?" + urlencode({"code": code, "state": query["state"]})
        return 302, {"Location": back}, b""

    def token(self, form: dict[str, str], authorization: str) -> tuple[int, dict]:
        self.token_requests.append(dict(form))
        client_id, secret = form.get("client_id"), form.get("client_secret")
        if authorization.startswith("Basic "):
            decoded = base64.b64decode(authorization[6:]).decode()
            client_id, _, secret = decoded.partition(":")
        if client_id != self.client_id or secret != self.client_secret:
            return 401, {"error": "invalid_client"}
        with self._lock:
            grant = self.codes.pop(form.get("code", ""), None)
        if grant is None or form.get("grant_type") != "authorization_code":
            return 400, {"error": "invalid_grant"}
        if grant.client_id != client_id or grant.redirect_uri != form.get("redirect_uri"):
            return 400, {"error": "invalid_grant"}
        if grant.code_challenge is not None:
            verifier = form.get("code_verifier", "")
            challenge = b64url(hashlib.sha256(verifier.encode()).digest())
            if grant.code_challenge_method != "S256" or challenge != grant.code_challenge:
                return 400, {"error": "invalid_grant", "error_description": "PKCE"}
        now = int(time.time())
        claims = {
            **grant.claims,
            "iss": self.issuer,
            "aud": self.client_id,
            "iat": now,
            "exp": now + 300,
            "nonce": grant.nonce,
        }
        key = self.key
        if self.tamper == "nonce":
            claims["nonce"] = "not-the-nonce-" + secrets.token_hex(4)
        elif self.tamper == "signature":
            key = self.other_key
        elif self.tamper == "audience":
            claims["aud"] = "another-client"
        access_token = secrets.token_urlsafe(24)
        with self._lock:
            self.access_tokens[access_token] = dict(grant.claims)
        return 200, {
            "access_token": access_token,
            "token_type": "Bearer",
            "expires_in": 300,
            "id_token": sign_jwt(claims, key),
        }

    def userinfo(self, authorization: str) -> tuple[int, dict]:
        claims = self.access_tokens.get(authorization.removeprefix("Bearer "))
        if claims is None:
            return 401, {"error": "invalid_token"}
        return 200, claims


class _Handler(BaseHTTPRequestHandler):
    provider: OidcProvider

    def log_message(self, format, *args):  # keep test output quiet
        pass

    def _reply(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, document: dict) -> None:
        self._reply(status, json.dumps(document).encode(), {"Content-Type": "application/json"})

    def do_GET(self):
        parts = urlsplit(self.path)
        self.provider.requests.append(f"GET {parts.path}")
        query = {name: values[0] for name, values in parse_qs(parts.query).items()}
        if parts.path == "/.well-known/openid-configuration":
            self._json(200, self.provider.discovery())
        elif parts.path == "/jwks":
            self._json(200, self.provider.jwks())
        elif parts.path == "/authorize":
            status, headers, body = self.provider.authorize(query)
            self._reply(status, body, headers)
        elif parts.path == "/userinfo":
            self._json(*self.provider.userinfo(self.headers.get("Authorization", "")))
        else:
            self._reply(404, b"not found")

    def do_POST(self):
        parts = urlsplit(self.path)
        self.provider.requests.append(f"POST {parts.path}")
        length = int(self.headers.get("Content-Length", "0"))
        form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
        if parts.path == "/token":
            self._json(*self.provider.token(form, self.headers.get("Authorization", "")))
        else:
            self._reply(404, b"not found")
