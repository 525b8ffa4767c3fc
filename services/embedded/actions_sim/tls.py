"""The simulator's TLS material (shared with the API emulator: ``services.embedded.tls``)."""

from services.embedded.tls import TlsMaterial, make_tls_material, server_context

__all__ = ["TlsMaterial", "make_tls_material", "server_context"]
