"""Constants the bundle builder (`prism build edge`) rewrites in the staged Worker."""

TARGET = "source"  # "local" or "cloudflare" in a built bundle
VERSION = "0.1.0"
KV_BINDING = "PRISM_KV"
