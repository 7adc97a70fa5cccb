"""Sockets only: the coordinator's router, a member's link socket, and the relays between them."""
