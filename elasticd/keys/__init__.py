"""CURVE keys and who may connect: the key store, the gatekeeper, and refusals seen on the wire."""
