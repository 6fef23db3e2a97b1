"""`prism deploy origin` against moto: resources, secrets hygiene, idempotency, CLI."""

from __future__ import annotations

import base64
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import pytest
import typer
from botocore.exceptions import ClientError
from typer.testing import CliRunner

from deploy.aws_origin import (
    DeployConfigError,
    DeployError,
    DeployResult,
    OriginDeployConfig,
    apply,
    plan,
)
from deploy.commands import deploy
from tests.fixtures.aws import MockAws

AMI = "ami-0123456789abcdef0"
SECRETS = {
    "REDIS_URL": "rediss://default:s3cr3t-redis-pw@eu1.upstash.io:6379",
    "PRISM_KEY_SECRET": "key-secret-0123456789abcdef",
    "OPENAI_API_KEY": "sk-test-openai-7f3a9c",
    # Quotes, `$`, backticks and backslashes must survive the systemd env file.
    "PRISM_FORWARD_SECRET": 'fw"d$ec`ret\\x',
}
PATH = "/prism/origin/main"


def make_config(**overrides: Any) -> OriginDeployConfig:
    fields: dict[str, Any] = {"secrets": SECRETS, "ami": AMI, **overrides}
    return OriginDeployConfig(**fields)


def deploy_with_log(config: OriginDeployConfig, aws: MockAws) -> tuple[DeployResult, list[str]]:
    log: list[str] = []
    return apply(config, aws.session, log.append), log


def live_instances(aws: MockAws, region: str | None = None) -> list[dict[str, Any]]:
    ec2 = aws.client("ec2", region)
    filters: Any = [
        {"Name": "tag:prism:role", "Values": ["origin"]},
        {"Name": "instance-state-name", "Values": ["pending", "running", "stopped"]},
    ]
    pages = ec2.describe_instances(Filters=filters)["Reservations"]
    return [i for r in pages for i in r["Instances"]]


def parameter_values(aws: MockAws, region: str | None = None) -> dict[str, tuple[str, str]]:
    ssm = aws.client("ssm", region)
    found = ssm.get_parameters_by_path(Path=PATH, WithDecryption=True)["Parameters"]
    return {p["Name"].rsplit("/", 1)[1]: (p["Type"], p["Value"]) for p in found}


def user_data(aws: MockAws, instance_id: str) -> tuple[str, str]:
    """(as AWS returns it: base64, decoded)."""
    ec2 = aws.client("ec2")
    raw = ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
    encoded = raw["UserData"]["Value"]
    return encoded, base64.b64decode(encoded).decode()


def test_first_apply_creates_one_instance_https_only_group_and_secure_parameters(
    aws: MockAws,
) -> None:
    result, _ = deploy_with_log(make_config(domain="origin.example.com"), aws)

    assert result.created and result.action == "created"
    [instance] = live_instances(aws)
    assert instance["InstanceId"] == result.instance_id
    tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
    assert tags["prism:stack"] == "main"
    assert tags["prism:role"] == "origin"
    assert tags["prism:region"] == aws.region
    assert instance["MetadataOptions"]["HttpTokens"] == "required"
    assert instance["IamInstanceProfile"]["Arn"].endswith(f"/prism-origin-main-{aws.region}")

    ec2 = aws.client("ec2")
    [group] = ec2.describe_security_groups(GroupIds=[result.security_group_id])["SecurityGroups"]
    assert group["GroupName"] == "prism-origin-main"
    [rule] = group["IpPermissions"]  # 443 only: no SSH, no 80 (ACME uses TLS-ALPN-01)
    assert (rule["IpProtocol"], rule["FromPort"], rule["ToPort"]) == ("tcp", 443, 443)
    assert [r["CidrIp"] for r in rule["IpRanges"]] == ["0.0.0.0/0"]
    assert [r["CidrIpv6"] for r in rule["Ipv6Ranges"]] == ["::/0"]

    assert parameter_values(aws) == {k: ("SecureString", v) for k, v in SECRETS.items()}
    [address] = ec2.describe_addresses(AllocationIds=[result.allocation_id])["Addresses"]
    assert address["InstanceId"] == result.instance_id == instance["InstanceId"]
    assert result.public_ip == address["PublicIp"]
    assert result.url == "https://origin.example.com"


def test_instance_role_may_read_only_its_parameter_path(aws: MockAws) -> None:
    result, _ = deploy_with_log(make_config(), aws)

    iam = aws.client("iam")
    document = iam.get_role_policy(
        RoleName=result.instance_profile, PolicyName="prism-origin-read-parameters"
    )["PolicyDocument"]
    policy = document if isinstance(document, dict) else json.loads(document)
    [statement] = policy["Statement"]
    assert sorted(statement["Action"]) == [
        "ssm:GetParameter",
        "ssm:GetParameters",
        "ssm:GetParametersByPath",
    ]
    prefix = f"arn:aws:ssm:{aws.region}:{aws.account_id}:parameter{PATH}"
    assert statement["Resource"] == [prefix, f"{prefix}/*"]


def test_no_secret_value_in_user_data_tags_progress_plan_or_repr(aws: MockAws) -> None:
    config = make_config()
    result, log = deploy_with_log(config, aws)

    encoded, decoded = user_data(aws, result.instance_id)
    [instance] = live_instances(aws)
    outputs = [
        encoded,
        decoded,
        json.dumps(instance["Tags"]),
        "\n".join(log),
        json.dumps(plan(config).to_dict()),
        json.dumps(result.to_dict()),
        repr(config),
    ]
    for value in SECRETS.values():
        hidden = base64.b64encode(value.encode()).decode()
        for text in outputs:
            assert value not in text
            assert hidden not in text
    # What the instance does get: parameter names, the path and the region.
    assert f"PARAMETER_PATH = '{PATH}'" in decoded
    assert f"REGION = '{aws.region}'" in decoded
    assert "prism origin serve --host 127.0.0.1 --port 8080" in decoded
    assert f"https://{result.public_ip} {{" in decoded  # no domain: the Elastic IP
    assert "tls internal" in decoded


def test_second_apply_updates_parameters_and_reboots_without_a_second_instance(
    aws: MockAws,
) -> None:
    first, _ = deploy_with_log(make_config(), aws)
    rotated = {**SECRETS, "PRISM_KEY_SECRET": "rotated-key-secret-fedcba9876"}

    second, log = deploy_with_log(make_config(secrets=rotated), aws)

    assert second.action == "updated"
    assert second.instance_id == first.instance_id
    assert second.public_ip == first.public_ip
    assert second.security_group_id == first.security_group_id
    assert second.parameters_changed == (f"{PATH}/PRISM_KEY_SECRET",)
    assert second.restarted  # the reboot reruns ExecStartPre, which refetches the secrets
    assert len(live_instances(aws)) == 1
    assert parameter_values(aws)["PRISM_KEY_SECRET"] == (
        "SecureString",
        rotated["PRISM_KEY_SECRET"],
    )
    assert "rotated-key-secret-fedcba9876" not in "\n".join(log)


def test_unchanged_second_apply_neither_writes_nor_restarts(aws: MockAws) -> None:
    first, _ = deploy_with_log(make_config(), aws)
    second, _ = deploy_with_log(make_config(), aws)

    assert second.instance_id == first.instance_id
    assert second.parameters_changed == ()
    assert not second.restarted


def test_unset_secret_is_deleted_from_the_stack_path(aws: MockAws) -> None:
    deploy_with_log(make_config(), aws)
    fewer = {k: v for k, v in SECRETS.items() if k != "OPENAI_API_KEY"}

    result, _ = deploy_with_log(make_config(secrets=fewer), aws)

    assert "OPENAI_API_KEY" not in parameter_values(aws)
    assert result.parameters_changed == (f"{PATH}/OPENAI_API_KEY",)


def test_package_change_replaces_the_instance_and_keeps_the_address(aws: MockAws) -> None:
    first, _ = deploy_with_log(make_config(), aws)

    second, _ = deploy_with_log(make_config(package="prism-gateway==0.2.0"), aws)

    assert second.action == "replaced"
    assert second.instance_id != first.instance_id
    assert second.terminated_instance_ids == (first.instance_id,)
    assert [i["InstanceId"] for i in live_instances(aws)] == [second.instance_id]
    assert second.public_ip == first.public_ip  # the Elastic IP moved: DNS stays valid
    assert "pip install prism-gateway==0.2.0\n" in user_data(aws, second.instance_id)[1]


def test_stopped_instance_is_started_again(aws: MockAws) -> None:
    first, _ = deploy_with_log(make_config(), aws)
    aws.client("ec2").stop_instances(InstanceIds=[first.instance_id])

    second, _ = deploy_with_log(make_config(), aws)

    assert second.instance_id == first.instance_id and second.restarted
    [instance] = live_instances(aws)
    assert instance["State"]["Name"] == "running"


def test_extra_ingress_rules_are_revoked(aws: MockAws) -> None:
    first, _ = deploy_with_log(make_config(), aws)
    ec2 = aws.client("ec2")
    ec2.authorize_security_group_ingress(
        GroupId=first.security_group_id,
        IpPermissions=[
            {
                "IpProtocol": "tcp",
                "FromPort": 22,
                "ToPort": 22,
                "IpRanges": [{"CidrIp": "0.0.0.0/0"}],
            }
        ],
    )

    deploy_with_log(make_config(), aws)

    [group] = ec2.describe_security_groups(GroupIds=[first.security_group_id])["SecurityGroups"]
    assert [(p["FromPort"], p["ToPort"]) for p in group["IpPermissions"]] == [(443, 443)]


def test_other_region_gets_its_own_independent_stack(aws: MockAws) -> None:
    home, _ = deploy_with_log(make_config(), aws)

    away, _ = deploy_with_log(make_config(region="eu-west-1"), aws)

    assert away.created and away.instance_id != home.instance_id
    assert len(live_instances(aws)) == 1
    assert len(live_instances(aws, "eu-west-1")) == 1
    assert parameter_values(aws, "eu-west-1") == parameter_values(aws)
    assert away.instance_profile == "prism-origin-main-eu-west-1"


def test_ami_is_looked_up_from_the_debian_public_parameter(aws: MockAws) -> None:
    aws.publish_public_parameter("/aws/service/debian/release/12/latest/amd64", "ami-0d0deb1a12")

    result, log = deploy_with_log(make_config(ami=None), aws)

    [instance] = live_instances(aws)
    assert instance["ImageId"] == "ami-0d0deb1a12" and result.created
    assert any("/aws/service/debian/release/12/latest/amd64" in line for line in log)


def test_missing_ami_parameters_fail_with_a_hint(aws: MockAws) -> None:
    with pytest.raises(DeployError, match="pass --ami"):
        deploy_with_log(make_config(ami=None), aws)


def test_invalid_config_is_rejected_without_echoing_secrets() -> None:
    with pytest.raises(DeployConfigError, match="REDIS_URL"):
        make_config(secrets={"PRISM_KEY_SECRET": "x" * 20})
    with pytest.raises(DeployConfigError, match="domain"):
        make_config(domain="not a domain")
    with pytest.raises(DeployConfigError, match="package"):
        make_config(package="--index-url=https://evil.example")
    # A token in the pip URL would end up in user-data.
    with pytest.raises(DeployConfigError, match="credentials") as caught:
        make_config(package="git+https://ghp_t0ken@github.com/acme/prism")
    assert "ghp_t0ken" not in str(caught.value)


def test_fetch_env_script_writes_a_private_systemd_env_file(aws: MockAws, tmp_path: Path) -> None:
    result, _ = deploy_with_log(
        make_config(secrets={**SECRETS, "PRISM_PROVIDERS_FILE": "[x]\n"}), aws
    )
    decoded = user_data(aws, result.instance_id)[1]
    script = re.search(r"prism-fetch-env <<'PRISM_EOF'\n(.*?)\nPRISM_EOF", decoded, re.S)
    assert script is not None
    source = script.group(1).replace(
        'RUN_DIR = "/run/prism-origin"', f"RUN_DIR = {str(tmp_path)!r}"
    )

    exec(compile(source, "prism-fetch-env", "exec"), {"__name__": "__main__"})

    env_file = tmp_path / "origin.env"
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    loaded = dict(_parse_systemd_env(line) for line in env_file.read_text().splitlines())
    assert loaded["PRISM_PROVIDERS_FILE"] == str(tmp_path / "providers.toml")
    assert (tmp_path / "providers.toml").read_text() == "[x]\n"
    assert {k: loaded[k] for k in SECRETS} == SECRETS


def _parse_systemd_env(line: str) -> tuple[str, str]:
    """systemd's EnvironmentFile rule for double quotes: backslash escapes the next char."""
    name, quoted = line.split("=", 1)
    assert quoted.startswith('"') and quoted.endswith('"')
    return name, re.sub(r"\\(.)", r"\1", quoted[1:-1])


# --- the Typer command -------------------------------------------------------------


@pytest.fixture
def cli() -> typer.Typer:
    root = typer.Typer()
    root.add_typer(deploy.app)
    return root


def error_lines(stderr: str) -> list[str]:
    """The command's error output: progress lines are on stderr too."""
    return [line for line in stderr.splitlines() if line.startswith("error")]


def cli_env(**overrides: str | None) -> dict[str, str | None]:
    cleared = dict.fromkeys(deploy.SECRET_ENV_VARS)
    return {**cleared, **SECRETS, **overrides}


def test_cli_missing_redis_url_exits_2_with_one_line(aws: MockAws, cli: typer.Typer) -> None:
    result = CliRunner().invoke(
        cli, ["deploy", "origin", "--ami", AMI], env=cli_env(REDIS_URL=None)
    )

    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "error: missing required environment variable(s): REDIS_URL"
    ]
    assert "Traceback" not in result.output
    assert live_instances(aws) == []


def test_cli_dry_run_prints_the_plan_and_creates_nothing(aws: MockAws, cli: typer.Typer) -> None:
    args = ["deploy", "origin", "--dry-run", "--json", "--domain", "origin.example.com"]
    result = CliRunner().invoke(cli, args, env=cli_env())

    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert shown["dry_run"] is True and shown["site"] == "origin.example.com"
    assert f"{PATH}/REDIS_URL" in [s["name"] for s in shown["steps"]]
    assert all(value not in result.output for value in SECRETS.values())
    assert live_instances(aws) == []
    assert parameter_values(aws) == {}
    ec2 = aws.client("ec2")
    groups = ec2.describe_security_groups()["SecurityGroups"]
    assert [g["GroupName"] for g in groups] == ["default"]


def test_cli_json_result_parses_and_hides_secrets(aws: MockAws, cli: typer.Typer) -> None:
    args = ["deploy", "origin", "--json", "--ami", AMI, "--region", "eu-west-1"]
    result = CliRunner().invoke(cli, args, env=cli_env())

    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert shown["action"] == "created" and shown["region"] == "eu-west-1"
    assert [i["InstanceId"] for i in live_instances(aws, "eu-west-1")] == [shown["instance_id"]]
    assert all(value not in result.output for value in SECRETS.values())


def test_cli_without_credentials_exits_1_with_one_line(
    cli: typer.Typer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # never probe IMDS

    result = CliRunner().invoke(cli, ["deploy", "origin", "--ami", AMI], env=cli_env())

    assert result.exit_code == 1
    assert error_lines(result.stderr) == [result.stderr.strip().splitlines()[-1]]
    assert result.stderr.strip().splitlines()[-1].startswith("error: no AWS credentials")


def test_cli_access_denied_is_one_line_with_secrets_masked(
    cli: typer.Typer, monkeypatch: pytest.MonkeyPatch
) -> None:
    def denied(*_: Any, **__: Any) -> DeployResult:
        message = f"not allowed\nto use {SECRETS['PRISM_KEY_SECRET']}"
        error = {"Error": {"Code": "AccessDenied", "Message": message}}
        raise ClientError(error, "PutParameter")  # type: ignore[arg-type]

    monkeypatch.setattr(deploy, "apply", denied)
    result = CliRunner().invoke(cli, ["deploy", "origin", "--ami", AMI], env=cli_env())

    assert result.exit_code == 1
    [line] = result.stderr.strip().splitlines()
    assert line == "error: AWS PutParameter denied: AccessDenied: not allowed to use ***"


def test_cli_help_documents_every_option_with_an_example(cli: typer.Typer) -> None:
    result = CliRunner().invoke(cli, ["deploy", "origin", "--help"], env={"COLUMNS": "200"})

    assert result.exit_code == 0
    assert "Example" in result.output
    for option in (
        "--region",
        "--name",
        "--instance-type",
        "--domain",
        "--ami",
        "--package",
        "--dry-run",
        "--json",
    ):
        assert option in result.output
