"""Finding a client's mutual-TLS material in a Muster TLS dir.

A TLS dir (``muster tls init`` / ``muster tls issue``, or ``<data>/tls`` of
``muster dev``) holds ``ca.pem`` and, per identity, ``<kind>-<name>.pem`` and
``<kind>-<name>-key.pem`` (kinds: server, agent, admin, client, reader). A
client presents an admin, client or reader certificate; the same choice as
the Rust CLI (tls/src/material.rs load_for_client).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# The DNS name every server certificate carries (tls/src/lib.rs SERVER_NAME).
SERVER_NAME = "server.muster"

_CLIENT_KINDS = ("admin", "client", "reader")


@dataclass(frozen=True)
class TlsMaterial:
    """PEM bytes for a channel: the CA, and this client's certificate and key."""

    identity: str
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes


def identities(tls_dir: Path) -> list[str]:
    """The identities (file stems) with both a certificate and a key in ``tls_dir``, sorted."""
    if not tls_dir.is_dir():
        return []
    stems = [p.name[: -len("-key.pem")] for p in tls_dir.iterdir() if p.name.endswith("-key.pem")]
    return sorted(s for s in stems if s != "ca" and (tls_dir / f"{s}.pem").is_file())


def choose_identity(tls_dir: Path, identity: str | None) -> str:
    """``identity`` if given, else the only admin-* (else client-*, else reader-*) identity."""
    stems = identities(tls_dir)
    if identity is not None:
        if identity not in stems:
            raise ValueError(
                f"identity {identity!r}: {tls_dir} has no {identity}.pem and {identity}-key.pem "
                f"(it holds: {', '.join(stems) or 'no certificate'})"
            )
        return identity
    for kind in _CLIENT_KINDS:
        of_kind = [s for s in stems if s.startswith(f"{kind}-")]
        if len(of_kind) == 1:
            return of_kind[0]
        if len(of_kind) > 1:
            break
    raise ValueError(
        f"identity: {tls_dir} holds {', '.join(stems) or 'no certificate'}: "
        "choose one with identity= (or MUSTER_IDENTITY), e.g. identity='admin-alice'"
    )


def load(tls_dir: str | Path, identity: str | None) -> TlsMaterial:
    """Reads the CA and the chosen identity's certificate and key; ValueError names what is wrong."""
    d = Path(tls_dir).expanduser()
    if not d.is_dir():
        raise ValueError(f"tls_dir: {d} is not a directory")
    ca = d / "ca.pem"
    if not ca.is_file():
        raise ValueError(f"tls_dir: {d} has no ca.pem (create one with `muster tls init`)")
    stem = choose_identity(d, identity)
    kind = stem.split("-", 1)[0]
    if kind not in _CLIENT_KINDS:
        raise ValueError(f"identity {stem!r}: a client presents an admin-, client- or reader- certificate, not {kind}")
    return TlsMaterial(
        identity=stem,
        ca_pem=ca.read_bytes(),
        cert_pem=(d / f"{stem}.pem").read_bytes(),
        key_pem=(d / f"{stem}-key.pem").read_bytes(),
    )
