import pytest

from prism import AuthenticationError, sign_forward, verify_forward

SECRET = b"forward-secret-0123456789"
FP = "ab" * 32


def test_signed_forward_verifies_until_expiry() -> None:
    header = sign_forward(
        SECRET, project="acme", key_id="k1k1k1k1", fingerprint=FP, now=1000, ttl=30
    )
    forwarded = verify_forward(SECRET, header, now=1029)
    assert (forwarded.project, forwarded.key_id, forwarded.fingerprint) == ("acme", "k1k1k1k1", FP)
    with pytest.raises(AuthenticationError, match="Expired"):
        verify_forward(SECRET, header, now=1031)


def test_tampered_or_foreign_forwards_fail() -> None:
    header = sign_forward(SECRET, project="acme", key_id="k1k1k1k1", fingerprint=FP, now=1000)
    for bad in (
        header.replace("acme", "evil"),
        header.replace(FP, "cd" * 32),
        header[:-2],
        "v1.garbage",
        "",
        sign_forward(
            b"another-secret-xxxxxxxx", project="acme", key_id="k1k1k1k1", fingerprint=FP, now=1000
        ),
    ):
        with pytest.raises(AuthenticationError):
            verify_forward(SECRET, bad, now=1000)
