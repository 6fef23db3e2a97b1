"""`prism deploy origin` against moto: resources, releases, blue/green upgrades, secrets, CLI.

moto runs no instance: the health check (the one thing only a booted instance could
answer) is injected, and records what AWS looked like when it was asked.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3
import pytest
import typer
from botocore.exceptions import ClientError
from typer.testing import CliRunner

from deploy.aws.origin import apply, plan
from deploy.aws.releases import ReleaseStore, bucket_name
from deploy.aws.stack import DeployConfigError, DeployError, DeployResult, OriginDeployConfig
from deploy.commands import deploy
from deploy.release import TARGETS, Release, lock_key
from tests.fixtures.aws import MockAws

if TYPE_CHECKING:
    from mypy_boto3_ec2.type_defs import InstanceTypeDef

REPO = Path(__file__).resolve().parents[3]
AMI = "ami-0123456789abcdef0"
SECRETS = {
    "REDIS_URL": "rediss://default:s3cr3t-redis-pw@eu1.upstash.io:6379",
    "PRISM_KEY_SECRET": "key-secret-0123456789abcdef",
    "OPENAI_API_KEY": "sk-test-openai-7f3a9c",
    # Quotes, `$`, backticks and backslashes must survive the systemd env file.
    "PRISM_FORWARD_SECRET": 'fw"d$ec`ret\\x-0123456789',
}
PATH = "/prism/origin/main"
TARGET = TARGETS["x86_64"]


# --- releases: built once per session, for real (conftest.py) --------------------------


def builder(release: Release) -> Callable[[str | None], Release]:
    """``apply``'s release builder, returning a prebuilt release (with the stored lock)."""

    def build(lock: str | None) -> Release:
        return release if lock is None else dataclasses.replace(release, lock=lock)

    return build


@dataclasses.dataclass
class Instances:
    """The injected health check: plays each new instance, and records what AWS looked
    like when it was asked (the Elastic IP must not have moved yet)."""

    aws: MockAws
    failing: set[str] = dataclasses.field(default_factory=set)
    calls: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def __call__(self, address: str, release: str) -> str | None:
        [(ec2, instance)] = [
            (ec2, i)
            for ec2 in (self.aws.client("ec2"), self.aws.client("ec2", "eu-west-1"))
            for r in ec2.describe_instances()["Reservations"]
            for i in r["Instances"]
            if i.get("PublicIpAddress") == address
        ]
        addresses = ec2.describe_addresses()["Addresses"]
        self.calls.append(
            {
                "instance": instance["InstanceId"],
                "release": release,
                "eip_on": [a.get("InstanceId") or None for a in addresses],
                "tagged": {t["Key"]: t["Value"] for t in instance["Tags"]}["prism:release"],
            }
        )
        if release in self.failing:
            return "/healthz answered 503: origin_unavailable"
        return None


@pytest.fixture
def instances(aws: MockAws) -> Instances:
    return Instances(aws)


def make_config(**overrides: Any) -> OriginDeployConfig:
    fields: dict[str, Any] = {"secrets": SECRETS, "ami": AMI, **overrides}
    return OriginDeployConfig(**fields)


def run(
    config: OriginDeployConfig,
    aws: MockAws,
    instances: Instances,
    release: Release | None = None,
    **options: Any,
) -> tuple[DeployResult, list[str]]:
    log: list[str] = []
    if not options.get("rollback"):
        assert release is not None
        options = {"release": builder(release), "lock_key": "deps-v1", **options}
    result = apply(config, aws.session, log.append, health_check=instances, **options)
    return result, log


def live_instances(aws: MockAws, region: str | None = None) -> list[InstanceTypeDef]:
    ec2 = aws.client("ec2", region)
    filters: Any = [
        {"Name": "tag:prism:role", "Values": ["origin"]},
        {"Name": "instance-state-name", "Values": ["pending", "running", "stopped"]},
    ]
    pages = ec2.describe_instances(Filters=filters)["Reservations"]
    return [i for r in pages for i in r["Instances"]]


def eip_target(aws: MockAws, result: DeployResult) -> str | None:
    [address] = aws.client("ec2").describe_addresses(AllocationIds=[result.allocation_id])[
        "Addresses"
    ]
    return address.get("InstanceId")


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


def stored_objects(aws: MockAws, result: DeployResult) -> dict[str, bytes]:
    s3 = aws.client("s3")
    listed = s3.list_objects_v2(Bucket=result.bucket).get("Contents", [])
    return {
        o["Key"]: s3.get_object(Bucket=result.bucket, Key=o["Key"])["Body"].read() for o in listed
    }


def test_first_deploy_stores_the_release_and_moves_the_address_once_healthy(
    aws: MockAws, instances: Instances, releases: list[Release]
) -> None:
    release = releases[0]
    result, _ = run(make_config(domain="origin.example.com"), aws, instances, release)

    assert result.created and result.action == "created" and result.release == release.id
    [instance] = live_instances(aws)
    assert instance["InstanceId"] == result.instance_id
    tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
    assert tags["prism:stack"] == "main"
    assert tags["prism:role"] == "origin"
    assert tags["prism:region"] == aws.region
    assert (tags["prism:release"], tags["prism:image"], tags["prism:python"]) == (
        release.id,
        "ubuntu-24.04",
        "3.12",
    )
    assert instance["MetadataOptions"]["HttpTokens"] == "required"
    assert instance["IamInstanceProfile"]["Arn"].endswith(f"/prism-origin-main-{aws.region}")
    # Checked on its own address before the Elastic IP pointed at it.
    assert instances.calls == [
        {
            "instance": result.instance_id,
            "release": release.id,
            "eip_on": [None],
            "tagged": release.id,
        }
    ]

    ec2 = aws.client("ec2")
    [group] = ec2.describe_security_groups(GroupIds=[result.security_group_id])["SecurityGroups"]
    assert group["GroupName"] == "prism-origin-main"
    [rule] = group["IpPermissions"]  # 443 only: no SSH, no 80 (ACME uses TLS-ALPN-01)
    assert (rule["IpProtocol"], rule["FromPort"], rule["ToPort"]) == ("tcp", 443, 443)
    assert [r["CidrIp"] for r in rule["IpRanges"]] == ["0.0.0.0/0"]
    assert [r["CidrIpv6"] for r in rule["Ipv6Ranges"]] == ["::/0"]

    assert parameter_values(aws) == {k: ("SecureString", v) for k, v in SECRETS.items()}
    assert eip_target(aws, result) == result.instance_id
    assert result.url == "https://origin.example.com"

    # The exact wheel and a requirements file that pins it by hash, under the stack prefix.
    assert result.bucket == bucket_name(aws.account_id, aws.region)
    objects = stored_objects(aws, result)
    prefix = f"origin/main/releases/{release.id}/"
    assert objects[prefix + release.wheel_name] == release.wheel
    requirements = objects[prefix + "requirements.txt"].decode()
    assert requirements == release.requirements
    wheel_line = f"/opt/prism/releases/{release.id}/{release.wheel_name} \\\n"
    assert wheel_line + f"    --hash=sha256:{release.wheel_sha256}\n" in requirements
    pinned = [line for line in requirements.splitlines() if line and not line.startswith(" ")]
    assert all("==" in line or line.startswith("/opt/prism/") for line in pinned), pinned
    assert "boto3==" in requirements and "uv==" not in requirements
    assert objects["origin/main/locks/deps-v1.txt"].decode() == release.lock
    assert release.wheel_name.startswith("prism_edge_gateway-")


def test_instance_role_reads_only_its_parameters_and_releases_and_writes_its_request_log(
    aws: MockAws, instances: Instances, releases: list[Release]
) -> None:
    result, _ = run(make_config(), aws, instances, releases[0])

    iam = aws.client("iam")

    def statement(policy_name: str) -> dict[str, Any]:
        document = iam.get_role_policy(RoleName=result.instance_profile, PolicyName=policy_name)
        policy = document["PolicyDocument"]
        [only] = (policy if isinstance(policy, dict) else json.loads(policy))["Statement"]
        return dict(only)

    read = statement("prism-origin-read-parameters")
    assert sorted(read["Action"]) == [
        "ssm:GetParameter",
        "ssm:GetParameters",
        "ssm:GetParametersByPath",
    ]
    prefix = f"arn:aws:ssm:{aws.region}:{aws.account_id}:parameter{PATH}"
    assert read["Resource"] == [prefix, f"{prefix}/*"]
    releases_policy = statement("prism-origin-read-releases")
    assert releases_policy["Action"] == "s3:GetObject"
    assert releases_policy["Resource"] == f"arn:aws:s3:::{result.bucket}/origin/main/releases/*"
    request_log = statement("prism-origin-write-request-log")  # put only, under its prefix
    assert request_log["Action"] == "s3:PutObject"
    assert request_log["Resource"] == f"arn:aws:s3:::{result.bucket}/origin/main/logs/requests/*"
    session_manager = statement("prism-origin-session-manager")  # instead of SSH
    assert "ssm:UpdateInstanceInformation" in session_manager["Action"]
    assert not any(a.startswith("ssm:Get") for a in session_manager["Action"])


def test_no_secret_value_in_user_data_tags_progress_plan_or_repr(
    aws: MockAws, instances: Instances, releases: list[Release]
) -> None:
    config = make_config()
    result, log = run(config, aws, instances, releases[0])

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
    # What the instance does get: parameter names, the path, the region, the release.
    assert f"PARAMETER_PATH = '{PATH}'" in decoded
    assert f"REGION = '{aws.region}'" in decoded
    assert f"RELEASE = '{result.release}'" in decoded
    assert f"BUCKET = '{result.bucket}'" in decoded
    assert (
        "ExecStart=/opt/prism/venv/bin/prism origin serve --host 127.0.0.1 --port 8080" in decoded
    )
    assert f"Environment=PRISM_RELEASE={result.release}" in decoded
    # The request log's files go to the release bucket, under the prefix the role may write.
    assert f"Environment=PRISM_LOG_BUCKET={result.bucket}\n" in decoded
    assert "Environment=PRISM_LOG_PREFIX=origin/main/logs/requests/\n" in decoded
    assert '"install", "--no-input", "--require-hashes", "-r", requirements' in decoded
    assert not re.search(r"pip install [a-z]", decoded)  # nothing installed by bare name
    assert f"https://{result.public_ip} {{" in decoded  # no domain: the Elastic IP
    assert "tls internal" in decoded


def test_rotated_secret_reboots_the_serving_instance_without_a_new_one(
    aws: MockAws, instances: Instances, releases: list[Release]
) -> None:
    first, _ = run(make_config(), aws, instances, releases[0])
    rotated = {**SECRETS, "PRISM_KEY_SECRET": "rotated-key-secret-fedcba9876"}

    second, log = run(make_config(secrets=rotated), aws, instances, releases[0])

    assert second.action == "updated"
    assert second.instance_id == first.instance_id
    assert second.public_ip == first.public_ip
    assert second.parameters_changed == (f"{PATH}/PRISM_KEY_SECRET",)
    assert second.restarted  # the reboot reruns ExecStartPre, which refetches the secrets
    assert len(live_instances(aws)) == 1
    assert parameter_values(aws)["PRISM_KEY_SECRET"] == (
        "SecureString",
        rotated["PRISM_KEY_SECRET"],
    )
    assert "rotated-key-secret-fedcba9876" not in "\n".join(log)


def test_rerun_without_a_change_changes_nothing(
    aws: MockAws, instances: Instances, releases: list[Release]
) -> None:
    first, _ = run(make_config(), aws, instances, releases[0])
    before = stored_objects(aws, first)

    second, log = run(make_config(), aws, instances, releases[0])

    assert second.action == "unchanged" and second.instance_id == first.instance_id
    assert second.parameters_changed == () and not second.restarted
    assert second.terminated_instance_ids == () and second.previous_release is None
    assert len(instances.calls) == 1  # no second instance to check
    assert stored_objects(aws, second) == before
    assert not [line for line in log if line.startswith(("Uploading", "Creating", "Launching"))]


def test_a_secret_left_out_of_a_redeploy_is_kept_unless_removed(
    aws: MockAws, instances: Instances, releases: list[Release]
) -> None:
    run(make_config(secrets={**SECRETS, "GROQ_API_KEY": "gsk-test-1"}), aws, instances, releases[0])

    kept, log = run(make_config(), aws, instances, releases[0])

    assert parameter_values(aws)["GROQ_API_KEY"] == ("SecureString", "gsk-test-1")
    assert kept.parameters_kept == (f"{PATH}/GROQ_API_KEY",) and kept.parameters_changed == ()
    assert f"Keeping stored SSM parameter {PATH}/GROQ_API_KEY (not set in this deploy)" in log

    removed, _ = run(make_config(remove_secrets=("GROQ_API_KEY",)), aws, instances, releases[0])

    assert "GROQ_API_KEY" not in parameter_values(aws)
    assert removed.parameters_changed == (f"{PATH}/GROQ_API_KEY",)


def test_a_new_wheel_runs_on_a_new_instance_that_takes_the_address_once_healthy(
    aws: MockAws, instances: Instances, releases: list[Release]
) -> None:
    first, _ = run(make_config(), aws, instances, releases[0])

    second, _ = run(make_config(), aws, instances, releases[1])

    assert releases[0].wheel_sha256 != releases[1].wheel_sha256
    assert second.action == "replaced" and second.release == releases[1].id
    assert second.previous_release == releases[0].id
    assert second.instance_id != first.instance_id
    # The health check ran while the old instance still had the address.
    assert instances.calls[-1] == {
        "instance": second.instance_id,
        "release": releases[1].id,
        "eip_on": [first.instance_id],
        "tagged": releases[1].id,
    }
    assert second.terminated_instance_ids == (first.instance_id,)
    assert [i["InstanceId"] for i in live_instances(aws)] == [second.instance_id]
    assert eip_target(aws, second) == second.instance_id
    assert second.public_ip == first.public_ip  # the Elastic IP moved: DNS stays valid
    assert f"RELEASE = '{releases[1].id}'" in user_data(aws, second.instance_id)[1]


def test_a_new_version_that_never_gets_healthy_is_terminated_and_the_old_keeps_serving(
    aws: MockAws, instances: Instances, releases: list[Release]
) -> None:
    first, _ = run(make_config(), aws, instances, releases[0])
    instances.failing.add(releases[1].id)

    with pytest.raises(DeployError) as caught:
        run(make_config(), aws, instances, releases[1])

    message = str(caught.value)
    assert "failed its health check: /healthz answered 503" in message
    assert f"{first.instance_id} keeps serving" in message
    assert [i["InstanceId"] for i in live_instances(aws)] == [first.instance_id]
    assert eip_target(aws, first) == first.instance_id
    # A later deploy of the serving release changes nothing.
    again, _ = run(make_config(), aws, instances, releases[0])
    assert again.action == "unchanged" and again.instance_id == first.instance_id


def test_rollback_returns_to_the_previous_release(
    aws: MockAws, instances: Instances, releases: list[Release]
) -> None:
    run(make_config(), aws, instances, releases[0])
    upgraded, _ = run(make_config(), aws, instances, releases[1])

    back, log = run(make_config(), aws, instances, rollback=True)

    assert back.rolled_back and back.release == releases[0].id
    assert back.previous_release == releases[1].id
    assert back.instance_id != upgraded.instance_id
    assert instances.calls[-1]["release"] == releases[0].id
    assert [i["InstanceId"] for i in live_instances(aws)] == [back.instance_id]
    assert eip_target(aws, back) == back.instance_id
    assert f"Rolling back from release {releases[1].id} to {releases[0].id}" in log


def test_rollback_without_an_earlier_release_says_so(
    aws: MockAws, instances: Instances, releases: list[Release]
) -> None:
    run(make_config(), aws, instances, releases[0])

    with pytest.raises(DeployError, match="nothing to roll back to"):
        run(make_config(), aws, instances, rollback=True)


def test_stopped_instance_is_started_again(
    aws: MockAws, instances: Instances, releases: list[Release]
) -> None:
    first, _ = run(make_config(), aws, instances, releases[0])
    aws.client("ec2").stop_instances(InstanceIds=[first.instance_id])

    second, _ = run(make_config(), aws, instances, releases[0])

    assert second.instance_id == first.instance_id and second.restarted
    [instance] = live_instances(aws)
    assert instance["State"]["Name"] == "running"


def test_extra_ingress_rules_are_revoked(
    aws: MockAws, instances: Instances, releases: list[Release]
) -> None:
    first, _ = run(make_config(), aws, instances, releases[0])
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

    run(make_config(), aws, instances, releases[0])

    [group] = ec2.describe_security_groups(GroupIds=[first.security_group_id])["SecurityGroups"]
    assert [(p["FromPort"], p["ToPort"]) for p in group["IpPermissions"]] == [(443, 443)]


def test_other_region_gets_its_own_independent_stack(
    aws: MockAws, instances: Instances, releases: list[Release]
) -> None:
    home, _ = run(make_config(), aws, instances, releases[0])

    away, _ = run(make_config(region="eu-west-1"), aws, instances, releases[0])

    assert away.created and away.instance_id != home.instance_id
    assert len(live_instances(aws)) == 1
    assert len(live_instances(aws, "eu-west-1")) == 1
    assert parameter_values(aws, "eu-west-1") == parameter_values(aws)
    assert away.instance_profile == "prism-origin-main-eu-west-1"
    assert away.bucket == bucket_name(aws.account_id, "eu-west-1") != home.bucket
    s3 = aws.client("s3")
    assert s3.get_bucket_location(Bucket=away.bucket)["LocationConstraint"] == "eu-west-1"


def test_ami_is_looked_up_from_the_ubuntu_public_parameter(
    aws: MockAws, instances: Instances, releases: list[Release]
) -> None:
    name = "/aws/service/canonical/ubuntu/server/24.04/stable/current/amd64/hvm/ebs-gp3/ami-id"
    aws.publish_public_parameter(name, "ami-0ab0b1a24042")

    result, log = run(make_config(ami=None), aws, instances, releases[0])

    [instance] = live_instances(aws)
    assert instance["ImageId"] == "ami-0ab0b1a24042" and result.created
    assert any(name in line for line in log)


def test_missing_ami_parameters_fail_with_a_hint(
    aws: MockAws, instances: Instances, releases: list[Release]
) -> None:
    with pytest.raises(DeployError, match="pass --ami"):
        run(make_config(ami=None), aws, instances, releases[0])


class _NoAws(boto3.Session):
    """A boto3 session that fails the test on any client."""

    def __init__(self) -> None:  # no session behind it: client() is all that may be called
        pass

    def client(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"an AWS client was made: {args}")


@pytest.mark.parametrize(
    ("secrets", "named"),
    [
        ({k: v for k, v in SECRETS.items() if k != "PRISM_FORWARD_SECRET"}, "PRISM_FORWARD_SECRET"),
        ({k: v for k, v in SECRETS.items() if k != "REDIS_URL"}, "REDIS_URL"),
        ({k: v for k, v in SECRETS.items() if k != "OPENAI_API_KEY"}, "no provider key"),
        ({**SECRETS, "PRISM_FORWARD_SECRET": "short"}, "at least 16"),
        (
            {**SECRETS, "PRISM_PROVIDERS_FILE": '[providers.groq]\napi_key_env = "GROQ_API_KEY"\n'},
            "GROQ_API_KEY",
        ),
    ],
)
def test_a_missing_required_secret_is_refused_before_any_aws_call(
    secrets: dict[str, str], named: str
) -> None:
    built: list[str | None] = []

    def build(lock: str | None) -> Release:
        built.append(lock)
        raise AssertionError("a release was built")

    with pytest.raises(DeployConfigError, match=named):
        config = make_config(secrets=secrets)
        apply(config, _NoAws(), release=build, lock_key="k")
    assert built == []


def test_invalid_config_is_rejected_without_echoing_secrets() -> None:
    with pytest.raises(DeployConfigError, match="domain"):
        make_config(domain="not a domain")
    with pytest.raises(DeployConfigError, match="remove"):
        make_config(remove_secrets=("PRISM_KEY_SECRET",))
    with pytest.raises(DeployConfigError) as caught:
        make_config(secrets={**SECRETS, "PRISM_FORWARD_SECRET": "tiny-secret"})
    assert "tiny-secret" not in str(caught.value)


def test_fetch_env_script_writes_a_private_systemd_env_file(
    aws: MockAws, instances: Instances, releases: list[Release], tmp_path: Path
) -> None:
    result, _ = run(
        make_config(secrets={**SECRETS, "PRISM_PROVIDERS_FILE": "[providers.x]\n"}),
        aws,
        instances,
        releases[0],
    )
    decoded = user_data(aws, result.instance_id)[1]
    script = re.search(r"prism-fetch-env <<'PRISM_EOF'\n(.*?)\nPRISM_EOF", decoded, re.S)
    assert script is not None
    assert script.group(1).startswith("#!/usr/bin/python3\n")  # apt's python3-boto3
    source = script.group(1).replace(
        'RUN_DIR = "/run/prism-origin"', f"RUN_DIR = {str(tmp_path)!r}"
    )

    exec(compile(source, "prism-fetch-env", "exec"), {"__name__": "__main__"})

    env_file = tmp_path / "origin.env"
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    loaded = dict(_parse_systemd_env(line) for line in env_file.read_text().splitlines())
    assert loaded["PRISM_PROVIDERS_FILE"] == str(tmp_path / "providers.toml")
    assert (tmp_path / "providers.toml").read_text() == "[providers.x]\n"
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
    assert f"{PATH}/REDIS_URL = ***" in [s["name"] for s in shown["steps"]]
    assert (shown["image"], shown["python"]) == ("ubuntu-24.04", "3.12")
    assert all(value not in result.output for value in SECRETS.values())
    assert live_instances(aws) == []
    assert parameter_values(aws) == {}
    ec2 = aws.client("ec2")
    groups = ec2.describe_security_groups()["SecurityGroups"]
    assert [g["GroupName"] for g in groups] == ["default"]


def test_cli_builds_this_checkout_into_the_same_release_and_hides_secrets(
    aws: MockAws,
    cli: typer.Typer,
    instances: Instances,
    releases: list[Release],
    instance_lock: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The lock for these dependencies is already stored (so no resolver runs here).
    store = ReleaseStore(
        aws.client("s3", "eu-west-1"),
        bucket_name(aws.account_id, "eu-west-1"),
        "origin/main/",
        lambda _: None,
    )
    store.ensure_bucket("eu-west-1", [])
    store.store_lock(lock_key(REPO, TARGET), instance_lock)
    monkeypatch.setattr(deploy, "apply", functools.partial(apply, health_check=instances))
    args = ["deploy", "origin", "--json", "--ami", AMI, "--region", "eu-west-1"]
    args += ["--source", str(REPO), "--pure"]  # the conftest's releases are pure

    result = CliRunner().invoke(cli, args, env=cli_env())

    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert shown["action"] == "created" and shown["region"] == "eu-west-1"
    # Built again from the same tree: the same bytes, so the same release.
    assert shown["release"] == releases[0].id

    back = CliRunner().invoke(cli, [*args, "--rollback"], env=cli_env())

    assert back.exit_code == 1
    assert error_lines(back.stderr) == [
        f"error: nothing to roll back to: release {releases[0].id} is the only one"
    ]
    assert [i["InstanceId"] for i in live_instances(aws, "eu-west-1")] == [shown["instance_id"]]
    assert all(value not in result.output for value in SECRETS.values())


def test_cli_says_why_an_unhealthy_release_did_not_take_over(
    aws: MockAws,
    cli: typer.Typer,
    instances: Instances,
    releases: list[Release],
    instance_lock: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    serving, _ = run(make_config(), aws, instances, releases[1])
    ReleaseStore(aws.client("s3"), serving.bucket, "origin/main/", lambda _: None).store_lock(
        lock_key(REPO, TARGET), instance_lock
    )
    instances.failing.add(releases[0].id)  # this checkout's release
    monkeypatch.setattr(deploy, "apply", functools.partial(apply, health_check=instances))

    result = CliRunner().invoke(
        cli, ["deploy", "origin", "--ami", AMI, "--source", str(REPO), "--pure"], env=cli_env()
    )

    assert result.exit_code == 1
    [line] = error_lines(result.stderr)
    assert f"(release {releases[0].id}) failed its health check: /healthz answered 503" in line
    assert f"{serving.instance_id} keeps serving" in line
    assert [i["InstanceId"] for i in live_instances(aws)] == [serving.instance_id]
    assert eip_target(aws, serving) == serving.instance_id


def test_cli_missing_forward_secret_exits_2_before_any_aws_call(
    aws: MockAws, cli: typer.Typer
) -> None:
    args = ["deploy", "origin", "--ami", AMI]
    result = CliRunner().invoke(cli, args, env=cli_env(PRISM_FORWARD_SECRET=None))

    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "error: missing required environment variable(s): PRISM_FORWARD_SECRET"
    ]
    assert live_instances(aws) == [] and parameter_values(aws) == {}
    assert aws.client("s3").list_buckets()["Buckets"] == []


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
        raise ClientError({"Error": {"Code": "AccessDenied", "Message": message}}, "PutParameter")

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
        "--source",
        "--rollback",
        "--remove-secret",
        "--dry-run",
        "--json",
    ):
        assert option in result.output
