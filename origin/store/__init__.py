"""Where answers are kept: the Redis cache and its connection, the Workers KV writer, and the
semantic cache."""
