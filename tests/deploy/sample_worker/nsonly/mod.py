# nsonly/ has no __init__.py: an implicit namespace package.
NAME = "namespace-ok"
