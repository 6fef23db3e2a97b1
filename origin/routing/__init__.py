"""From a request to a provider's answer: the router and one request's way through its route
(order, retries, hedges, failover), targets and their health gates, the first byte of a
stream, and the coalescing of identical calls in flight."""
