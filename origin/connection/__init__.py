"""The Redis connection every part of the origin shares: the client protocol, and the
auto-pipelined client it normally runs on."""
