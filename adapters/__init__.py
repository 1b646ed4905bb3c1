"""Adapters: the core's ports made real - the Redis stores, the member clients (judges,
external scorers, the code sandbox) and the egress guard."""
