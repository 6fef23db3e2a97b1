"""A package whose __init__ imports itself absolutely and its parts relatively."""

from pkg import thing  # absolute import of a submodule from the package's own __init__

from . import helpers
from .sub import deep

FROM_INIT = helpers.shout(thing.BASE) + "/" + deep.DEPTH
