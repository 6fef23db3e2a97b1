"""Prism's shared core: what the edge and the origin must agree on.

Standard library only, no I/O and no work at import, so it runs unchanged in
CPython and in the Pyodide Workers runtime.
"""

from .classify import MIN_TTL, CacheDecision, CachePolicy, classify
from .envelope import Envelope, entry_key
from .envelope import decode as decode_envelope
from .envelope import encode as encode_envelope
from .errors import (
    AuthenticationError,
    InvalidRequestError,
    MethodNotAllowedError,
    NotFoundError,
    PermissionDeniedError,
    PrismError,
    RateLimitError,
    RequestTimeoutError,
    RequestTooLargeError,
    UpstreamError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
    error_body,
    error_json,
)
from .fingerprint import EXCLUDED_FIELDS, canonical_document, fingerprint
from .forward import Forwarded, ForwardRejected, body_digest, sign_forward, verify_forward
from .keys import (
    REVOKED_KEY,
    KeyIdentity,
    KeyRing,
    bearer_token,
    key_hash,
    parse_key_secrets,
    valid_project_id,
)
from .memos import RecentBodies, RecentEntries
from .policy import (
    BUDGET_PERIODS,
    DEFAULT_SEMANTIC_THRESHOLD,
    POLICY_KEY_PREFIX,
    Budget,
    CacheRules,
    LogRules,
    Policy,
    PolicyMemo,
    policy_key,
)
from .rate_limits import LIMITS_KEY_PREFIX, Limit, RateLimits, limits_key
from .request import ChatRequest, Limits, parse_chat_request
from .sse import SSEDecoder, StreamAssembler, replay

__all__ = [
    "BUDGET_PERIODS",
    "DEFAULT_SEMANTIC_THRESHOLD",
    "EXCLUDED_FIELDS",
    "LIMITS_KEY_PREFIX",
    "MIN_TTL",
    "POLICY_KEY_PREFIX",
    "REVOKED_KEY",
    "AuthenticationError",
    "Budget",
    "CacheDecision",
    "CachePolicy",
    "CacheRules",
    "ChatRequest",
    "Envelope",
    "ForwardRejected",
    "Forwarded",
    "InvalidRequestError",
    "KeyIdentity",
    "KeyRing",
    "Limit",
    "Limits",
    "LogRules",
    "MethodNotAllowedError",
    "NotFoundError",
    "PermissionDeniedError",
    "Policy",
    "PolicyMemo",
    "PrismError",
    "RateLimitError",
    "RateLimits",
    "RecentBodies",
    "RecentEntries",
    "RequestTimeoutError",
    "RequestTooLargeError",
    "SSEDecoder",
    "StreamAssembler",
    "UpstreamError",
    "UpstreamTimeoutError",
    "UpstreamUnavailableError",
    "bearer_token",
    "body_digest",
    "canonical_document",
    "classify",
    "decode_envelope",
    "encode_envelope",
    "entry_key",
    "error_body",
    "error_json",
    "fingerprint",
    "key_hash",
    "limits_key",
    "parse_chat_request",
    "parse_key_secrets",
    "policy_key",
    "replay",
    "sign_forward",
    "valid_project_id",
    "verify_forward",
]
