from ..helpers import shout  # parent-relative import

DEPTH = shout("deep")
