import json
from pathlib import Path

from typer.testing import CliRunner

from deploy.cli import app
from prism import fingerprint
from prism.embeddings_request import parse_embeddings_request

SECRET = "cli-test-secret-0123456789"
runner = CliRunner()
BODY = '{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"temperature":1.0}'


def test_minted_key_verifies_and_prints_project() -> None:
    minted = runner.invoke(
        app, ["keys", "mint", "--project", "acme"], env={"PRISM_KEY_SECRET": SECRET}
    )
    assert minted.exit_code == 0, minted.output
    key = minted.stdout.strip()
    verified = runner.invoke(app, ["keys", "verify", key], env={"PRISM_KEY_SECRET": SECRET})
    assert verified.exit_code == 0 and verified.stdout.strip() == "acme"
    as_json = runner.invoke(
        app, ["keys", "verify", key, "--json"], env={"PRISM_KEY_SECRET": SECRET}
    )
    assert json.loads(as_json.stdout)["project"] == "acme"


def test_bad_key_exits_1_with_reason_and_no_traceback() -> None:
    key = runner.invoke(
        app, ["keys", "mint", "-p", "acme"], env={"PRISM_KEY_SECRET": SECRET}
    ).stdout.strip()
    result = runner.invoke(
        app, ["keys", "verify", key[:-1] + "x"], env={"PRISM_KEY_SECRET": SECRET}
    )
    assert result.exit_code == 1
    assert "invalid" in result.output.lower() and "Traceback" not in result.output
    other = runner.invoke(
        app, ["keys", "verify", key], env={"PRISM_KEY_SECRET": "another-secret-abcdefgh"}
    )
    assert other.exit_code == 1


def test_missing_secret_is_one_clear_line() -> None:
    result = runner.invoke(app, ["keys", "mint", "-p", "acme"], env={"PRISM_KEY_SECRET": ""})
    assert result.exit_code == 2
    assert "PRISM_KEY_SECRET" in result.output and "Traceback" not in result.output


def test_fingerprint_command_matches_across_spellings_and_explains(tmp_path: Path) -> None:
    body = tmp_path / "body.json"
    body.write_text(BODY)
    first = runner.invoke(app, ["fingerprint", "--project", "acme", str(body)])
    second = runner.invoke(
        app,
        ["fingerprint", "--project", "acme", "-"],
        input=BODY.replace("1.0", "1").replace('"stream":true,', ""),
    )
    assert first.exit_code == 0 and len(first.stdout.strip()) == 64
    assert first.stdout == second.stdout
    explained = runner.invoke(app, ["fingerprint", "-p", "acme", str(body), "--explain"])
    assert "left out:    stream" in explained.stdout and '"temperature": 1' in explained.stdout
    bad = runner.invoke(app, ["fingerprint", "-p", "acme", "-"], input="{nope")
    assert bad.exit_code == 1 and "400" in bad.output


def test_fingerprint_command_takes_the_other_apis_bodies() -> None:
    body = '{"model":"text-embedding-3-small","input":["a","b"],"user":"u"}'
    embeddings = runner.invoke(
        app, ["fingerprint", "-p", "acme", "--path", "/v1/embeddings", "-"], input=body
    )
    assert embeddings.exit_code == 0, embeddings.output
    expected = fingerprint("acme", "/v1/embeddings", parse_embeddings_request(body))
    assert embeddings.stdout.strip() == expected
    messages = runner.invoke(
        app,
        ["fingerprint", "-p", "acme", "--path", "/v1/messages", "-"],
        input='{"model":"m","messages":[{"role":"user","content":"hi"}]}',
    )
    assert messages.exit_code == 1 and "max_tokens" in messages.output
    unknown = runner.invoke(app, ["fingerprint", "-p", "acme", "--path", "/v1/x", "-"], input="{}")
    assert unknown.exit_code == 2 and "/v1/embeddings" in unknown.output
