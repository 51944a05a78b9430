"""Tokens for automation: `kiln.Client().tokens`, what `kiln token create|ls|revoke` do. Every
user manages their own tokens; a token narrowed to one project acts there with a role no higher
than its user's.

    client = kiln.Client()
    created = client.tokens.create("ci", expires="30d", project="vision", role="viewer")
    print(created.secret)                     # shown once: give it to the pipeline as KILN_TOKEN
    for token in client.tokens.list():
        print(token.name, token.project, token.role, token.last_used_at_ms)
    client.tokens.revoke("ci")                # by name or id; every service refuses it at once
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from kiln.v1 import tenancy_pb2

from ._address import Metadata
from ._errors import translated
from ._jobs import Duration, _parse_duration
from ._manage import ManageStubs

_ROLES = {"viewer": tenancy_pb2.ROLE_VIEWER, "member": tenancy_pb2.ROLE_MEMBER,
          "maintainer": tenancy_pb2.ROLE_MAINTAINER}
_ROLE_NAMES = {value: name for name, value in _ROLES.items()}


@dataclass(frozen=True)
class Token:
    """A token as kiln keeps it (never its secret). Times are in ms since the epoch, 0 for
    never (`last_used_at_ms`: never used; `expires_at_ms`: never expires). `project` and `role`
    ("viewer", "member" or "maintainer") are empty for a token with all its user's rights."""

    id: str
    name: str
    user: str
    created_at_ms: int = 0
    last_used_at_ms: int = 0
    expires_at_ms: int = 0
    revoked: bool = False
    project: str = ""
    role: str = ""


@dataclass(frozen=True)
class NewToken:
    """A token just made: `token` and its `secret`, which is shown this once (kiln keeps only
    its hash). Calls made with it carry `authorization: Bearer <secret>`; a client uses it as
    KILN_TOKEN."""

    token: Token
    secret: str = ""

    def __repr__(self) -> str:  # the secret stays out of logs and tracebacks
        return f"NewToken(token={self.token!r}, secret='...')"


def _token(message: tenancy_pb2.Token) -> Token:
    return Token(id=message.id, name=message.name, user=message.user, created_at_ms=message.created_at_ms,
                 last_used_at_ms=message.last_used_at_ms, expires_at_ms=message.expires_at_ms,
                 revoked=message.revoked, project=message.project, role=_ROLE_NAMES.get(message.role, ""))


class Tokens:
    """Makes, lists and revokes your tokens: `kiln.Client().tokens`."""

    def __init__(self, stubs: Callable[[], ManageStubs], metadata: Metadata):
        self._stubs = stubs  # the client's, opened on first use
        self._metadata = metadata

    def create(self, name: str = "", *, expires: Duration | None = None, project: str = "",
               role: str = "") -> NewToken:
        """Makes a token of yours named `name` (unique among your live tokens; generated when
        empty) that expires after `expires` (seconds, or "30d", "12h", "90m"; None: never),
        narrowed to `project` with `role` ("viewer", "member", "maintainer"; both or neither).

            created = client.tokens.create("nightly", expires="7d")
            os.environ["KILN_TOKEN"] = created.secret
        """
        if bool(project) != bool(role):
            raise ValueError("kiln: a token is narrowed to a project and a role: give both, or neither")
        if role and role not in _ROLES:
            raise ValueError(f"kiln: role must be one of {', '.join(_ROLES)}, not {role!r}")
        request = tenancy_pb2.CreateTokenRequest(
            name=name, expires_in_secs=0 if expires is None else _parse_duration(expires, "expires"),
            project=project, role=_ROLES.get(role, tenancy_pb2.ROLE_UNSPECIFIED),
        )
        with translated():
            created = self._stubs().users.CreateToken(request, metadata=self._metadata, timeout=60)
        return NewToken(token=_token(created.token), secret=created.secret)

    def revoke(self, token: str) -> Token:
        """Revokes one of your tokens by name or id (an admin: anyone's by id); every service
        refuses it from then on (the predictor's inference calls within its token cache, 5 s).

            client.tokens.revoke("nightly")
        """
        with translated():
            return _token(self._stubs().users.RevokeToken(tenancy_pb2.RevokeTokenRequest(token=token),
                                                          metadata=self._metadata, timeout=60))

    # Last in the class: below it, `list` in an annotation would name this method.
    def list(self, *, all: bool = False) -> list[Token]:
        """Your live tokens; revoked and expired ones too with `all` (`kiln token ls`)."""
        with translated():
            listed = self._stubs().users.ListTokens(tenancy_pb2.ListTokensRequest(all=all), metadata=self._metadata,
                                                    timeout=60).tokens
        return [_token(token) for token in listed]


__all__ = ["NewToken", "Token", "Tokens"]
