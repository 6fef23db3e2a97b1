import pytest
from hypothesis import given
from hypothesis import strategies as st

from prism import AuthenticationError, ForwardRejected, sign_forward, verify_forward
from prism.forward import FORWARD_TTL_SECONDS

SECRET = b"forward-secret-0123456789"
FP = "ab" * 32
CHAT = ("POST", "/v1/chat/completions")


def signed(now: float = 1000, ttl: int = FORWARD_TTL_SECONDS, route: tuple[str, str] = CHAT) -> str:
    method, path = route
    return sign_forward(
        SECRET,
        method=method,
        path=path,
        project="acme",
        key_id="k1k1k1k1",
        fingerprint=FP,
        now=now,
        ttl=ttl,
    )


def verify(header: str, now: float = 1000, route: tuple[str, str] = CHAT) -> object:
    method, path = route
    return verify_forward(SECRET, header, method=method, path=path, now=now)


def test_signed_forward_verifies_until_expiry() -> None:
    header = signed(now=1000, ttl=5)
    forwarded = verify_forward(SECRET, header, method="POST", path=CHAT[1], now=1004.9)
    assert (forwarded.project, forwarded.key_id, forwarded.fingerprint) == ("acme", "k1k1k1k1", FP)
    with pytest.raises(ForwardRejected) as caught:
        verify(header, now=1006)
    assert (caught.value.reason, caught.value.code) == ("expired", "forward_expired")


def test_a_forward_is_valid_for_seconds_not_half_a_minute() -> None:
    assert FORWARD_TTL_SECONDS <= 5
    with pytest.raises(ForwardRejected):
        verify(signed(now=1000), now=1000 + FORWARD_TTL_SECONDS + 1)


@pytest.mark.parametrize(
    "route",
    [
        ("GET", "/v1/models"),  # the chat forward used as a credential on another route
        ("GET", "/v1/chat/completions"),  # another method
        ("POST", "/v1/chat/completions/"),
        ("POST", "/metrics"),
        ("post", "/v1/chat/completions"),
    ],
)
def test_a_forward_is_bound_to_its_method_and_path(route: tuple[str, str]) -> None:
    with pytest.raises(ForwardRejected) as caught:
        verify(signed(), route=route)
    assert (caught.value.reason, caught.value.code, caught.value.status) == (
        "signature",
        "invalid_forward",
        401,
    )
    assert verify(signed(route=route), route=route)


def test_tampered_or_foreign_forwards_fail() -> None:
    header = signed()
    for bad in (
        header.replace("acme", "evil"),
        header.replace(FP, "cd" * 32),
        header.replace("v2.", "v1.", 1),
        header[:-2],
        "v2.garbage",
        "",
        "v2.1\u0661\u0662.acme.k1k1k1k1." + FP + ".sig",
        sign_forward(
            b"another-secret-xxxxxxxx",
            method="POST",
            path=CHAT[1],
            project="acme",
            key_id="k1k1k1k1",
            fingerprint=FP,
            now=1000,
        ),
    ):
        with pytest.raises(AuthenticationError):
            verify(bad)


@given(st.text(max_size=300))
def test_any_header_text_is_a_401_never_another_exception(header: str) -> None:
    with pytest.raises(ForwardRejected):
        verify(header)
