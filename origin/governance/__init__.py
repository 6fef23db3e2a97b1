"""What a request may do and what it costs: project policies, rate limits and their leases,
budgets, billing, token bounds, prices, usage and the audit log."""
