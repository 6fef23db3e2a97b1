"""Redaction: a secret of a known form, embedded anywhere in any text, never survives."""

from __future__ import annotations

import string

from hypothesis import given
from hypothesis import strategies as st

from origin.requestlog.redaction import REDACTED, Redactor

_TOKEN = string.ascii_letters + string.digits
_surrounding = st.text(max_size=60)


def _chars(alphabet: str, low: int, high: int) -> st.SearchStrategy[str]:
    return st.text(st.sampled_from(alphabet), min_size=low, max_size=high)


openai_keys = st.builds(lambda s: "sk-" + s, _chars(_TOKEN + "-_", 20, 60))
anthropic_keys = st.builds(lambda s: "sk-ant-api03-" + s, _chars(_TOKEN + "-_", 20, 90))
prism_keys = st.builds(
    lambda p, k, sig: f"sk-prism-v1.{p}.{k}.{sig}",
    _chars(string.ascii_lowercase, 3, 12),
    _chars(_TOKEN, 8, 16),
    _chars(_TOKEN + "-_", 20, 44),
)
aws_keys = st.builds(
    lambda prefix, s: prefix + s,
    st.sampled_from(["AKIA", "ASIA"]),
    _chars(string.ascii_uppercase + string.digits, 16, 16),
)
bearers = st.builds(
    lambda word, gap, s: f"{word}{gap}{s}",
    st.sampled_from(["Bearer", "bearer", "BEARER"]),
    st.sampled_from([" ", "  ", "\t"]),
    _chars(_TOKEN + "-._~+/", 16, 80),
)
jwts = st.builds(
    lambda a, b, c: f"eyJ{a}.eyJ{b}.{c}",
    _chars(_TOKEN + "-_", 8, 40),
    _chars(_TOKEN + "-_", 8, 80),
    _chars(_TOKEN + "-_", 16, 64),
)
secrets = st.one_of(openai_keys, anthropic_keys, prism_keys, aws_keys, bearers, jwts)
emails = st.builds(
    lambda user, domain, tld: f"{user}@{domain}.{tld}",
    _chars(_TOKEN + "._+-", 1, 20),
    _chars(string.ascii_lowercase + string.digits, 1, 20),
    _chars(string.ascii_lowercase, 2, 6),
)


@given(before=_surrounding, secret=secrets, after=_surrounding)
def test_a_secret_anywhere_in_text_never_survives(before: str, secret: str, after: str) -> None:
    redacted = Redactor().text(before + secret + after)
    assert secret not in redacted
    assert REDACTED in redacted


@given(before=_surrounding, secret=secrets, after=_surrounding, email=emails)
def test_with_emails_neither_a_secret_nor_an_email_survives(
    before: str, secret: str, after: str, email: str
) -> None:
    redacted = Redactor(emails=True).text(f"{before}{email}{after}{secret}{before}")
    assert secret not in redacted and email not in redacted


@given(secret=secrets, where=st.lists(st.sampled_from(["a", "b", "c"]), max_size=3))
def test_a_secret_deep_in_a_json_value_never_survives(secret: str, where: list[str]) -> None:
    value: object = {"content": f"look: {secret}!"}
    for name in where:
        value = {name: [value, 1, None, True]}
    assert secret not in repr(Redactor().json(value))


def test_plain_text_is_left_alone() -> None:
    text = "The skeleton key is a sk- prefix; Bearer of news; AKIA is short; eyJ."
    assert Redactor().text(text) == text
    assert Redactor().text("write to me@example.com") == "write to me@example.com"
    assert Redactor(emails=True).text("write to me@example.com") == f"write to {REDACTED}"
