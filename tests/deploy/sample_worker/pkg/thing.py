from .helpers import shout
from .sub.deep import DEPTH

BASE = "thing"
VALUE = shout(BASE) + ":" + DEPTH
