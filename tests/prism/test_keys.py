import secrets
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prism import AuthenticationError, KeyRing, bearer_token, key_hash, parse_key_secrets

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
    assert bearer_token("Bearer sk-prism-v1.a.b.c") == "sk-prism-v1.a.b.c"
    assert bearer_token("bearer  spaced ") == "spaced"
    assert bearer_token("Basic dXNlcg==") == ""
    assert bearer_token("Bearer") == ""
    assert bearer_token(None) == ""


# ---------------------------------------------------------------- one spelling per key

# Characters str.isdigit() accepts and int() reads (or chokes on) that are not ASCII digits.
ODD_DIGITS = "\u00b9\u00b2\u00b3\u0661\u0662\u06f1\uff11\uff12\u0967\u09e7\U0001d7cf"
ANY_TEXT = st.text(max_size=50)
DIGITISH = st.text(st.sampled_from("0123456789" + ODD_DIGITS), max_size=4) | st.text(max_size=4)


def verdict(ring: KeyRing, key: str) -> tuple[str, str]:
    """What a half makes of ``key``: accepted (and for which project) or the 401's code.
    Anything else (a 500) escapes and fails the test."""
    try:
        return ("ok", ring.verify(key).project)
    except AuthenticationError as error:
        return ("refused", error.code)


@st.composite
def respelled_keys(draw: st.DrawFn) -> tuple[str, str]:
    """A valid key and the same key with some of its ASCII digits written as look-alikes."""
    ring = KeyRing({1: SECRET_V1})
    key = ring.mint("acme", key_id=draw(st.from_regex(r"[a-f0-9]{16}", fullmatch=True)))
    digits = [i for i, char in enumerate(key) if char.isascii() and char.isdigit()]
    chosen = draw(st.sets(st.sampled_from(digits), min_size=1))
    chars = list(key)
    for i in chosen:
        chars[i] = draw(st.sampled_from(ODD_DIGITS))
    return key, "".join(chars)


@settings(max_examples=200)
@given(respelled_keys())
def test_no_look_alike_digit_spells_a_valid_key(keys: tuple[str, str]) -> None:
    key, respelled = keys
    ring = KeyRing({1: SECRET_V1})
    assert verdict(ring, key) == ("ok", "acme")
    assert verdict(ring, respelled) == ("refused", "invalid_api_key")


@settings(max_examples=200)
@given(respelled_keys(), st.sampled_from(["utf-8", "latin-1"]))
def test_the_edge_and_the_origin_agree_on_any_authorization_bytes(
    keys: tuple[str, str], edge_reading: str
) -> None:
    """The origin reads header bytes as latin-1 (ASGI); a runtime may hand the edge the
    UTF-8 reading instead. Whatever the bytes, both readings get the same verdict."""
    ring = KeyRing({1: SECRET_V1})
    for key in keys:
        raw = f"Bearer {key}".encode()
        as_origin = verdict(ring, bearer_token(raw.decode("latin-1")))
        as_edge = verdict(ring, bearer_token(raw.decode(edge_reading, "replace")))
        assert as_origin == as_edge


@settings(max_examples=300)
@given(version=DIGITISH, project=ANY_TEXT, key_id=ANY_TEXT, signature=ANY_TEXT)
def test_any_key_shaped_text_is_a_401_never_another_error(
    version: str, project: str, key_id: str, signature: str
) -> None:
    ring = KeyRing({1: SECRET_V1})
    assert verdict(ring, f"sk-prism-v{version}.{project}.{key_id}.{signature}")[0] == "refused"


@given(st.text(max_size=250))
def test_any_text_is_a_401_never_another_error(text: str) -> None:
    assert verdict(KeyRing({1: SECRET_V1}), bearer_token(f"Bearer {text}"))[0] == "refused"


@pytest.mark.parametrize("digit", ODD_DIGITS)
def test_odd_digits_in_a_key_version_are_refused(ring: KeyRing, digit: str) -> None:
    key = ring.mint("acme")
    with pytest.raises(AuthenticationError) as caught:
        ring.verify(key.replace("sk-prism-v1.", f"sk-prism-v{digit}.", 1))
    assert caught.value.code == "invalid_api_key"


def test_odd_digits_in_a_secret_version_are_refused() -> None:
    with pytest.raises(ValueError):
        parse_key_secrets(f"\u0662:{SECRET_V2.decode()},1:{SECRET_V1.decode()}")


def test_bearer_token_trims_only_ascii_blanks() -> None:
    assert bearer_token("Bearer \tkey\t ") == "key"
    assert bearer_token("Bearer key\u00a0") == "key\u00a0"
    assert bearer_token("Bearer \u2003key") == "\u2003key"
