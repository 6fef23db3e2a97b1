import secrets
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prism import AuthenticationError, KeyRing, key_hash, parse_key_secrets

SECRET_V1 = b"v1-secret-0123456789abcdef"
SECRET_V2 = b"v2-secret-fedcba9876543210"


@pytest.fixture
def ring() -> KeyRing:
    return KeyRing({1: SECRET_V1})


def test_minted_key_verifies_to_its_project(ring: KeyRing) -> None:
    key = ring.mint("acme")
    identity = ring.verify(key)
    assert identity.project == "acme"
    assert identity.version == 1
    assert len(identity.key_id) == 16


def test_random_strings_never_verify(ring: KeyRing) -> None:
    alphabet = string.ascii_letters + string.digits + ".-_"
    for _ in range(10_000):
        candidate = "".join(secrets.choice(alphabet) for _ in range(secrets.randbelow(120)))
        with pytest.raises(AuthenticationError):
            ring.verify(candidate)
    for _ in range(2_000):  # random keys with the right shape
        forged = f"sk-prism-v1.acme.{secrets.token_hex(8)}.{secrets.token_urlsafe(32)[:43]}"
        with pytest.raises(AuthenticationError):
            ring.verify(forged)


def test_every_single_character_change_fails(ring: KeyRing) -> None:
    key = ring.mint("acme")
    alphabet = string.ascii_letters + string.digits + ".-_"
    changed = 0
    for position in range(len(key)):
        for char in alphabet:
            if char == key[position]:
                continue
            mutated = key[:position] + char + key[position + 1 :]
            with pytest.raises(AuthenticationError):
                ring.verify(mutated)
            changed += 1
    assert changed == len(key) * (len(alphabet) - 1)
    for position in range(len(key)):  # deletions too
        with pytest.raises(AuthenticationError):
            ring.verify(key[:position] + key[position + 1 :])


def test_a_key_of_one_project_never_verifies_as_another(ring: KeyRing) -> None:
    key = ring.mint("acme")
    _, _project, key_id, signature = key.removeprefix("sk-prism-v").split(".")
    with pytest.raises(AuthenticationError):
        ring.verify(f"sk-prism-v1.globex.{key_id}.{signature}")
    assert ring.verify(key).project == "acme"


def test_rotation_keeps_both_versions_until_retired() -> None:
    old = KeyRing({1: SECRET_V1})
    old_key = old.mint("acme")
    rotated = parse_key_secrets(f"2:{SECRET_V2.decode()},1:{SECRET_V1.decode()}")
    assert rotated.current == 2
    new_key = rotated.mint("acme")
    assert new_key.startswith("sk-prism-v2.")
    assert rotated.verify(old_key).version == 1
    assert rotated.verify(new_key).version == 2
    retired = parse_key_secrets(f"2:{SECRET_V2.decode()}")
    assert retired.verify(new_key).project == "acme"
    with pytest.raises(AuthenticationError) as caught:
        retired.verify(old_key)
    assert caught.value.code == "key_version_retired"


def test_a_key_signed_with_another_secret_fails() -> None:
    key = KeyRing({1: b"x" * 32}).mint("acme")
    with pytest.raises(AuthenticationError):
        KeyRing({1: SECRET_V1}).verify(key)


def test_error_messages_never_contain_the_key(ring: KeyRing) -> None:
    key = ring.mint("acme")
    for bad in (key[:-1] + ("A" if key[-1] != "A" else "B"), key + "x", "sk-prism-v9." + key[12:]):
        with pytest.raises(AuthenticationError) as caught:
            ring.verify(bad)
        assert bad not in caught.value.message
        assert key[-20:] not in caught.value.message


@settings(max_examples=50)
@given(project=st.from_regex(r"[a-z0-9][a-z0-9_-]{0,20}", fullmatch=True))
def test_any_valid_project_round_trips(project: str) -> None:
    ring = KeyRing({3: SECRET_V2})
    assert ring.verify(ring.mint(project)).project == project


def test_bad_inputs_to_mint_and_secrets_are_refused() -> None:
    with pytest.raises(ValueError):
        KeyRing({1: b"short"})
    with pytest.raises(ValueError):
        KeyRing({1: SECRET_V1}).mint("Bad.Project")
    with pytest.raises(ValueError):
        parse_key_secrets("  ")
    assert parse_key_secrets(SECRET_V1.decode()).versions == (1,)


def test_key_hash_is_not_the_key(ring: KeyRing) -> None:
    key = ring.mint("acme")
    assert key_hash(key) != key and len(key_hash(key)) == 64


def test_bearer_token_reads_only_the_bearer_scheme() -> None:
    from prism import bearer_token

    assert bearer_token("Bearer sk-prism-v1.a.b.c") == "sk-prism-v1.a.b.c"
    assert bearer_token("bearer  spaced ") == "spaced"
    assert bearer_token("Basic dXNlcg==") == ""
    assert bearer_token("Bearer") == ""
    assert bearer_token(None) == ""
