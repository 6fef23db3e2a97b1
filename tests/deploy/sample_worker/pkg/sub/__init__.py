from .deep import DEPTH as DEPTH
