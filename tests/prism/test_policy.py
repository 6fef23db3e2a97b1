"""The model policy: globs, deny wins, canonical JSON, and errors that name the field."""

from __future__ import annotations

import json

import pytest

from prism import Budget, PermissionDeniedError, Policy, PolicyMemo, error_body, policy_key


def test_deny_wins_and_an_empty_allow_allows_everything() -> None:
    policy = Policy(allow=("gpt-4o*", "demo"), deny=("gpt-4o-mini*",))
    assert policy.allows("gpt-4o") and policy.allows("gpt-4o-2024-08-06") and policy.allows("demo")
    assert not policy.allows("gpt-4o-mini")  # allowed by a glob, denied by another: denied
    assert not policy.allows("o1-preview")  # not in a non-empty allow list
    assert policy.allows("GPT-4o") and not policy.allows("GPT-4O-MINI")  # globs ignore case
    everything_but = Policy(deny=("o1*",))
    assert everything_but.allows("anything") and not everything_but.allows("o1")
    assert Policy().allows("whatever")


def test_a_refused_model_is_a_403_model_not_allowed_in_the_openai_shape() -> None:
    with pytest.raises(PermissionDeniedError) as caught:
        Policy(deny=("o1*",)).check_model("o1-mini")
    error = caught.value
    assert error.status == 403
    assert error_body(error)["error"] == {
        "message": "Model 'o1-mini' is not allowed for this project.",
        "type": "permission_error",
        "param": "model",
        "code": "model_not_allowed",
    }
    Policy(deny=("o1*",)).check_model("gpt-4o")  # allowed: no error


def test_encode_is_canonical_and_parses_back_to_an_equal_policy() -> None:
    policy = Policy(
        allow=["b*", "a*", "b*"],  # type: ignore[arg-type]  # a list on purpose: kept as a tuple
        deny=("x",),
        revision=2,
        updated_at="2026-01-01T00:00:00.000Z",
    )
    assert policy.allow == ("b*", "a*")  # duplicates dropped, order kept
    raw = policy.encode()
    assert raw == json.dumps(json.loads(raw), sort_keys=True, separators=(",", ":")).encode()
    assert Policy.parse(raw) == policy and Policy.parse(raw).encode() == raw
    assert hash(Policy.parse(raw)) == hash(policy)
    assert policy_key("acme") == "prism:policy:acme"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("not json", "policy: not valid JSON"),
        ("[]", "policy: must be a JSON object"),
        ('{"allow": "gpt-4o"}', "allow: must be a list"),
        ('{"allow": [""]}', "allow[0]: must be a non-empty string"),
        ('{"deny": ["ok", 3]}', "deny[1]: must be a non-empty string"),
        ('{"deny": ["gpt 4o"]}', "deny[0]: 'gpt 4o' has whitespace"),
        ('{"allow": ["' + "x" * 201 + '"]}', "allow[0]: at most 200 characters"),
        ('{"allow": [' + ",".join(f'"m{i}"' for i in range(65)) + "]}", "allow: at most 64"),
        ('{"budget": 10}', "budget: must be an object"),
        ('{"budget": {"period": "day"}}', "budget.usd: required"),
        ('{"budget": {"usd": 0}}', "budget.usd: must be above 0"),
        ('{"budget": {"usd": -5, "period": "day"}}', "budget.usd: must be above 0"),
        ('{"budget": {"usd": "5"}}', "budget.usd: must be a number"),
        ('{"budget": {"usd": true}}', "budget.usd: must be a number"),
        ('{"budget": {"usd": NaN}}', "budget.usd: must be a number"),
        ('{"budget": {"usd": 1e12}}', "budget.usd: must be above 0 and at most"),
        ('{"budget": {"usd": 1e-9}}', "budget.usd: must be at least 0.000001"),
        ('{"budget": {"usd": 5, "period": "week"}}', "budget.period: must be day or month"),
        ('{"budget": {"usd": 5, "cap": 1}}', "budget.cap: unknown field"),
        ('{"rate_limits": {}}', "rate_limits: set at least one limit"),
        ('{"alow": []}', "alow: unknown field"),
        ('{"v": 2}', "v: unsupported policy format 2"),
        ('{"revision": -1}', "revision: must not be negative"),
        ('{"revision": true}', "revision: must be a whole number"),
        ('{"updated_by": 5}', "updated_by: must be at most"),
    ],
)
def test_an_invalid_policy_is_refused_naming_the_field(raw: str, message: str) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("[", r"\[").replace("]", r"\]")):
        Policy.parse(raw)


def test_a_budget_round_trips_in_canonical_json_and_records_without_one_keep_their_bytes() -> None:
    plain = Policy(deny=("o1*",))
    assert b"budget" not in plain.encode()  # a record written before budgets: same bytes
    policy = Policy.parse('{"budget": {"usd": 12.3456789, "period": "day"}, "deny": ["o1*"]}')
    assert policy.budget == Budget(usd=12.345679, period="day")  # to the micro-dollar
    assert policy.budget.micro_usd == 12_345_679
    assert Policy.parse(policy.encode()) == policy
    assert json.loads(policy.encode())["budget"] == {"period": "day", "usd": 12.345679}
    assert Policy.parse('{"budget": {"usd": 3}}').budget == Budget(3, "month")  # default
    assert policy != plain and hash(policy) != hash(plain)


def test_the_memo_parses_each_record_once() -> None:
    memo = PolicyMemo(size=2)
    raw = Policy(deny=("o1*",)).encode()
    first = memo.get(raw)
    assert memo.get(bytes(raw)) is first  # equal bytes, the same parsed policy
    with pytest.raises(ValueError, match="not valid JSON"):
        memo.get(b"{")
    with pytest.raises(ValueError, match="not valid JSON"):
        memo.get(b"{")
    memo.get(Policy().encode())  # full: cleared, and still right
    assert memo.get(raw) == first
