"""The origin's dashboard: its figures over time, on the admin listener, behind the admin key."""

from .access import AdminAccess
from .figures import Rates, Totals, rates_between, totals_of
from .history import History
from .pages import Dashboard, dashboard_off_routes

__all__ = [
    "AdminAccess",
    "Dashboard",
    "History",
    "Rates",
    "Totals",
    "dashboard_off_routes",
    "rates_between",
    "totals_of",
]
