"""`prism deploy origin --instances N`: a region on an Auto Scaling group behind a Network
Load Balancer, against moto.

moto runs no instance and implements no instance refresh: the health check through the
load balancer is injected (as for one instance), and instance refresh is played by
:class:`tests.deploy.aws.refreshes.InstanceRefreshes` over moto's real launch template,
group and instances.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import boto3
import moto.settings
import pytest
import typer
from typer.testing import CliRunner

from deploy.aws.origin import apply, plan
from deploy.aws.releases import ReleaseStore, bucket_name
from deploy.aws.stack import DeployConfigError, DeployError, DeployResult, OriginDeployConfig
from deploy.aws.userdata import HEALTH_HOST, render_caddyfile
from deploy.commands import deploy
from deploy.release import Release, lock_key
from tests.deploy.aws.conftest import REPO, TARGET
from tests.deploy.aws.refreshes import InstanceRefreshes
from tests.deploy.aws.test_deploy_origin import AMI, SECRETS, builder, cli_env, live_instances
from tests.fixtures.aws import MockAws

DOMAIN = "origin.example.com"
GROUP = "prism-origin-main"


@dataclasses.dataclass
class ThroughBalancer:
    """The injected health check, dialled at the load balancer: records which release
    each call expected and what the group ran then."""

    aws: MockAws
    failing: set[str] = dataclasses.field(default_factory=set)
    calls: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def __call__(self, address: str, release: str) -> str | None:
        [balancer] = self.aws.client("elbv2").describe_load_balancers()["LoadBalancers"]
        group = describe_group(self.aws)
        self.calls.append(
            {
                "address": address,
                "is_balancer": address == balancer["DNSName"],
                "release": release,
                "group_version": group["LaunchTemplate"]["Version"],
                "tagged": sorted({instance_release(self.aws, i) for i in group_ids(self.aws)}),
            }
        )
        if release in self.failing:
            return "/healthz answered 503: origin_unavailable"
        return None


@pytest.fixture
def balancer_check(aws: MockAws) -> ThroughBalancer:
    return ThroughBalancer(aws)


@pytest.fixture
def refreshes(aws: MockAws) -> Iterator[InstanceRefreshes]:
    stand_in = InstanceRefreshes(aws)
    stand_in.install(aws.session)
    yield stand_in
    stand_in.uninstall(aws.session)


@pytest.fixture(autouse=True)
def _issued_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """moto issues a requested certificate after this many seconds (AWS: once the
    validation record resolves)."""
    monkeypatch.setattr(moto.settings, "ACM_VALIDATION_WAIT", -1)


def fleet_config(**overrides: Any) -> OriginDeployConfig:
    fields: dict[str, Any] = {
        "secrets": SECRETS,
        "ami": AMI,
        "instances": 3,
        "domain": DOMAIN,
        **overrides,
    }
    return OriginDeployConfig(**fields)


def deploy_fleet(
    config: OriginDeployConfig,
    aws: MockAws,
    check: ThroughBalancer,
    release: Release | None = None,
    **options: Any,
) -> tuple[DeployResult, list[str]]:
    log: list[str] = []
    if not options.get("rollback"):
        assert release is not None
        options = {"release": builder(release), "lock_key": "deps-v1", **options}
    slept: list[float] = []
    result = apply(
        config, aws.session, log.append, health_check=check, sleep=slept.append, **options
    )
    return result, log


def describe_group(aws: MockAws) -> dict[str, Any]:
    [group] = aws.client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[GROUP])[
        "AutoScalingGroups"
    ]
    return dict(group)


def group_ids(aws: MockAws) -> list[str]:
    return sorted(i["InstanceId"] for i in describe_group(aws)["Instances"])


def instance_release(aws: MockAws, instance_id: str) -> str:
    [reservation] = aws.client("ec2").describe_instances(InstanceIds=[instance_id])["Reservations"]
    tags = {t["Key"]: t["Value"] for t in reservation["Instances"][0]["Tags"]}
    return tags["prism:release"]


def template_versions(aws: MockAws) -> dict[int, dict[str, Any]]:
    found = aws.client("ec2").describe_launch_template_versions(LaunchTemplateName=GROUP)
    return {int(v["VersionNumber"]): dict(v) for v in found["LaunchTemplateVersions"]}


def version_user_data(aws: MockAws, version: int) -> str:
    encoded = template_versions(aws)[version]["LaunchTemplateData"]["UserData"]
    return base64.b64decode(encoded).decode()


def test_three_instances_behind_a_network_load_balancer(
    aws: MockAws,
    balancer_check: ThroughBalancer,
    refreshes: InstanceRefreshes,
    releases: list[Release],
) -> None:
    release = releases[0]
    result, _ = deploy_fleet(fleet_config(), aws, balancer_check, release)

    assert result.action == "created" and result.release == release.id
    group = describe_group(aws)
    assert (group["MinSize"], group["DesiredCapacity"], group["MaxSize"]) == (3, 3, 3)
    assert group["HealthCheckType"] == "ELB"
    assert group["LaunchTemplate"]["Version"] == "1"  # explicit: refresh can roll it back
    ids = group_ids(aws)
    assert len(ids) == 3 and list(result.instance_ids) == ids
    assert {instance_release(aws, i) for i in ids} == {release.id}
    assert len(group["VPCZoneIdentifier"].split(",")) >= 2  # every default subnet's zone

    # Every instance renders the same pinned, hash-checked release.
    [version] = template_versions(aws).values()
    data = version["LaunchTemplateData"]
    assert (data["ImageId"], data["InstanceType"]) == (AMI, "t3.small")
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    assert data["IamInstanceProfile"]["Name"] == f"prism-origin-main-{aws.region}"
    decoded = version_user_data(aws, 1)
    assert f"RELEASE = '{release.id}'" in decoded
    assert release.wheel_sha256 in decoded and '"--require-hashes"' in decoded
    # Behind the load balancer: its certificate is public, Caddy's is internal and
    # answers any Host (the target group's health checks name the instance's IP).
    assert f"https://{DOMAIN}, https://{HEALTH_HOST}, :443 {{\n\ttls internal\n" in decoded
    assert "issuer acme" not in decoded
    assert all(value not in decoded for value in SECRETS.values())

    elbv2 = aws.client("elbv2")
    [balancer] = elbv2.describe_load_balancers()["LoadBalancers"]
    assert (balancer["Type"], balancer["Scheme"]) == ("network", "internet-facing")
    assert result.load_balancer == balancer["DNSName"]
    [target_group] = elbv2.describe_target_groups()["TargetGroups"]
    assert (target_group["Protocol"], target_group["Port"]) == ("TLS", 443)
    assert (target_group["HealthCheckProtocol"], target_group["HealthCheckPath"]) == (
        "HTTPS",
        "/healthz",
    )
    assert group["TargetGroupARNs"] == [target_group["TargetGroupArn"]]
    targets = elbv2.describe_target_health(TargetGroupArn=target_group["TargetGroupArn"])
    assert sorted(t["Target"]["Id"] for t in targets["TargetHealthDescriptions"]) == ids
    [listener] = elbv2.describe_listeners(LoadBalancerArn=balancer["LoadBalancerArn"])["Listeners"]
    assert (listener["Protocol"], listener["Port"]) == ("TLS", 443)
    assert [c["CertificateArn"] for c in listener["Certificates"]] == [result.certificate_arn]
    assert listener["DefaultActions"][0]["TargetGroupArn"] == target_group["TargetGroupArn"]
    [certificate] = aws.client("acm").list_certificates()["CertificateSummaryList"]
    assert certificate["DomainName"] == DOMAIN

    # No Elastic IP: the domain points at the load balancer, checked through it.
    assert aws.client("ec2").describe_addresses()["Addresses"] == []
    assert result.url == f"https://{DOMAIN}"
    assert balancer_check.calls == [
        {
            "address": balancer["DNSName"],
            "is_balancer": True,
            "release": release.id,
            "group_version": "1",
            "tagged": [release.id],
        }
    ]
    assert refreshes.started == []


def test_a_rerun_with_the_same_inputs_changes_nothing(
    aws: MockAws,
    balancer_check: ThroughBalancer,
    refreshes: InstanceRefreshes,
    releases: list[Release],
) -> None:
    first, _ = deploy_fleet(fleet_config(), aws, balancer_check, releases[0])

    second, log = deploy_fleet(fleet_config(), aws, balancer_check, releases[0])

    assert second.action == "unchanged"
    assert second.instance_ids == first.instance_ids
    assert second.launch_template_version == 1 and list(template_versions(aws)) == [1]
    assert second.instance_refresh_id is None and refreshes.started == []
    assert not [line for line in log if line.startswith(("Creating", "Adding", "Starting"))]
    assert len(aws.client("elbv2").describe_load_balancers()["LoadBalancers"]) == 1
    assert len(aws.client("acm").list_certificates()["CertificateSummaryList"]) == 1
    assert second.certificate_arn == first.certificate_arn


def test_a_new_count_changes_the_group_size_only(
    aws: MockAws,
    balancer_check: ThroughBalancer,
    refreshes: InstanceRefreshes,
    releases: list[Release],
) -> None:
    first, _ = deploy_fleet(fleet_config(), aws, balancer_check, releases[0])

    bigger, log = deploy_fleet(
        fleet_config(instances=4, max_instances=6), aws, balancer_check, releases[0]
    )

    assert bigger.action == "updated"
    group = describe_group(aws)
    assert (group["MinSize"], group["DesiredCapacity"], group["MaxSize"]) == (4, 4, 6)
    assert set(first.instance_ids) < set(group_ids(aws)) and len(group_ids(aws)) == 4
    assert list(template_versions(aws)) == [1] and refreshes.started == []
    assert "Resizing prism-origin-main from 3 to 4 instances (min 4, max 6)" in log


def test_a_new_release_is_an_instance_refresh_that_keeps_capacity(
    aws: MockAws,
    balancer_check: ThroughBalancer,
    refreshes: InstanceRefreshes,
    releases: list[Release],
) -> None:
    first, _ = deploy_fleet(fleet_config(), aws, balancer_check, releases[0])

    second, log = deploy_fleet(fleet_config(), aws, balancer_check, releases[1])

    assert second.action == "replaced" and second.release == releases[1].id
    assert second.previous_release == releases[0].id
    assert second.launch_template_version == 2
    assert f"RELEASE = '{releases[1].id}'" in version_user_data(aws, 2)
    [started] = refreshes.started
    assert started == {
        "AutoScalingGroupName": GROUP,
        "Strategy": "Rolling",
        "DesiredConfiguration": {"LaunchTemplate": {"LaunchTemplateName": GROUP, "Version": "2"}},
        "Preferences": {
            "MinHealthyPercentage": 100,
            "MaxHealthyPercentage": 200,
            "AutoRollback": True,
            "InstanceWarmup": 60,
            "SkipMatching": True,
        },
    }
    assert second.instance_refresh_id == "refresh-1"
    assert any("InProgress, 50% done" in line for line in log)  # it waited for the end
    group = describe_group(aws)
    assert group["LaunchTemplate"]["Version"] == "2"
    ids = group_ids(aws)
    assert len(ids) == 3 and not set(ids) & set(first.instance_ids)
    assert {instance_release(aws, i) for i in ids} == {releases[1].id}
    [template] = aws.client("ec2").describe_launch_templates(LaunchTemplateNames=[GROUP])[
        "LaunchTemplates"
    ]
    assert template["DefaultVersionNumber"] == 2
    # Then our own check, through the load balancer, of the new release.
    assert balancer_check.calls[-1]["release"] == releases[1].id
    assert balancer_check.calls[-1]["is_balancer"]
    assert balancer_check.calls[-1]["tagged"] == [releases[1].id]


def test_a_refresh_whose_instances_fail_their_health_checks_is_rolled_back(
    aws: MockAws,
    balancer_check: ThroughBalancer,
    refreshes: InstanceRefreshes,
    releases: list[Release],
) -> None:
    first, _ = deploy_fleet(fleet_config(), aws, balancer_check, releases[0])
    refreshes.unhealthy.add(releases[1].id)

    with pytest.raises(DeployError) as caught:
        deploy_fleet(fleet_config(), aws, balancer_check, releases[1])

    message = str(caught.value)
    assert "instance refresh refresh-1 to version 2" in message
    assert "ended RollbackSuccessful: Instances failed to pass their ELB health checks" in message
    assert "the previous instances serve" in message
    assert describe_group(aws)["LaunchTemplate"]["Version"] == "1"
    assert group_ids(aws) == sorted(first.instance_ids)
    assert [c["release"] for c in balancer_check.calls] == [releases[0].id]
    # The serving release is unchanged, so a redeploy of it changes nothing.
    again, _ = deploy_fleet(fleet_config(), aws, balancer_check, releases[0])
    assert again.action == "unchanged" and again.launch_template_version == 1


def test_a_release_unhealthy_through_the_balancer_is_refreshed_back(
    aws: MockAws,
    balancer_check: ThroughBalancer,
    refreshes: InstanceRefreshes,
    releases: list[Release],
) -> None:
    deploy_fleet(fleet_config(), aws, balancer_check, releases[0])
    balancer_check.failing.add(releases[1].id)

    with pytest.raises(DeployError) as caught:
        deploy_fleet(fleet_config(), aws, balancer_check, releases[1])

    message = str(caught.value)
    assert f"release {releases[1].id} failed its health check through the load balancer" in message
    assert f"rolled back to release {releases[0].id} (launch template version 1)" in message
    back = [s["DesiredConfiguration"]["LaunchTemplate"]["Version"] for s in refreshes.started]
    assert back == ["2", "1"]
    assert describe_group(aws)["LaunchTemplate"]["Version"] == "1"
    assert {instance_release(aws, i) for i in group_ids(aws)} == {releases[0].id}
    [template] = aws.client("ec2").describe_launch_templates(LaunchTemplateNames=[GROUP])[
        "LaunchTemplates"
    ]
    assert template["DefaultVersionNumber"] == 1


def test_rollback_returns_to_the_previous_template_version(
    aws: MockAws,
    balancer_check: ThroughBalancer,
    refreshes: InstanceRefreshes,
    releases: list[Release],
) -> None:
    deploy_fleet(fleet_config(), aws, balancer_check, releases[0])
    deploy_fleet(fleet_config(), aws, balancer_check, releases[1])

    back, log = deploy_fleet(fleet_config(), aws, balancer_check, rollback=True)

    assert back.rolled_back and back.release == releases[0].id
    assert back.previous_release == releases[1].id
    assert back.launch_template_version == 1 and list(template_versions(aws)) == [1, 2]
    assert refreshes.started[-1]["DesiredConfiguration"]["LaunchTemplate"]["Version"] == "1"
    assert {instance_release(aws, i) for i in group_ids(aws)} == {releases[0].id}
    assert f"Rolling back from release {releases[1].id} to {releases[0].id}" in log


def test_new_secrets_refresh_every_instance_on_the_same_version(
    aws: MockAws,
    balancer_check: ThroughBalancer,
    refreshes: InstanceRefreshes,
    releases: list[Release],
) -> None:
    first, _ = deploy_fleet(fleet_config(), aws, balancer_check, releases[0])
    rotated = {**SECRETS, "PRISM_KEY_SECRET": "rotated-key-secret-fedcba9876"}

    second, log = deploy_fleet(fleet_config(secrets=rotated), aws, balancer_check, releases[0])

    assert second.action == "updated" and second.restarted
    [started] = refreshes.started
    assert started["DesiredConfiguration"]["LaunchTemplate"]["Version"] == "1"
    assert started["Preferences"]["SkipMatching"] is False  # replace them all
    assert not set(group_ids(aws)) & set(first.instance_ids)
    assert "rotated-key-secret-fedcba9876" not in "\n".join(log)


def test_without_a_domain_tcp_passes_through_to_caddy(
    aws: MockAws,
    balancer_check: ThroughBalancer,
    refreshes: InstanceRefreshes,
    releases: list[Release],
) -> None:
    result, _ = deploy_fleet(
        fleet_config(domain=None, instances=2), aws, balancer_check, releases[0]
    )

    elbv2 = aws.client("elbv2")
    [target_group] = elbv2.describe_target_groups()["TargetGroups"]
    assert target_group["Protocol"] == "TCP" and target_group["HealthCheckProtocol"] == "HTTPS"
    [balancer] = elbv2.describe_load_balancers()["LoadBalancers"]
    [listener] = elbv2.describe_listeners(LoadBalancerArn=balancer["LoadBalancerArn"])["Listeners"]
    assert listener["Protocol"] == "TCP" and not listener.get("Certificates")
    assert result.certificate_arn is None and result.url == f"https://{balancer['DNSName']}"
    assert f"https://{balancer['DNSName']}, https://{HEALTH_HOST}, :443 {{" in version_user_data(
        aws, 1
    )
    assert aws.client("acm").list_certificates()["CertificateSummaryList"] == []


def test_a_certificate_awaiting_validation_names_the_record_before_any_instance(
    aws: MockAws,
    balancer_check: ThroughBalancer,
    refreshes: InstanceRefreshes,
    releases: list[Release],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(moto.settings, "ACM_VALIDATION_WAIT", 3600)

    with pytest.raises(DeployError) as caught:
        deploy_fleet(fleet_config(), aws, balancer_check, releases[0])

    message = str(caught.value)
    assert f"the ACM certificate for {DOMAIN} awaits DNS validation: add CNAME " in message
    assert "then run this deploy again" in message
    groups = aws.client("autoscaling").describe_auto_scaling_groups()["AutoScalingGroups"]
    assert groups == [] and live_instances(aws) == []
    # Once ACM has issued it, the same deploy goes on with the same certificate.
    monkeypatch.setattr(moto.settings, "ACM_VALIDATION_WAIT", -1)
    result, _ = deploy_fleet(fleet_config(), aws, balancer_check, releases[0])
    assert result.action == "created" and result.certificate_arn is not None
    assert result.certificate_arn in message


def test_a_stack_keeps_its_shape(
    aws: MockAws,
    balancer_check: ThroughBalancer,
    refreshes: InstanceRefreshes,
    releases: list[Release],
) -> None:
    deploy_fleet(fleet_config(), aws, balancer_check, releases[0])

    with pytest.raises(DeployError, match="runs as an Auto Scaling group"):
        deploy_fleet(fleet_config(instances=1), aws, balancer_check, releases[0])
    assert len(group_ids(aws)) == 3
    assert aws.client("ec2").describe_addresses()["Addresses"] == []

    with pytest.raises(DeployError, match="runs on one instance with an Elastic IP"):
        aws.client("ec2").allocate_address(
            Domain="vpc",
            TagSpecifications=[
                {
                    "ResourceType": "elastic-ip",
                    "Tags": [
                        {"Key": "prism:stack", "Value": "other"},
                        {"Key": "prism:role", "Value": "origin"},
                        {"Key": "prism:region", "Value": aws.region},
                    ],
                }
            ],
        )
        deploy_fleet(fleet_config(name="other"), aws, balancer_check, releases[0])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"instances": 0}, "instances must be 1 to 100"),
        ({"instances": 101}, "instances must be 1 to 100"),
        ({"instances": 1, "max_instances": 3}, "--min and --max need --instances 2"),
        ({"instances": 3, "min_instances": 4}, r"min \(4\) <= instances \(3\)"),
        ({"instances": 3, "max_instances": 2}, r"instances \(3\) <= max \(2\)"),
        ({"instances": 3, "min_instances": 0}, r"1 <= min \(0\)"),
    ],
)
def test_capacity_is_checked_before_any_aws_call(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(DeployConfigError, match=message):
        fleet_config(**overrides)


def test_keep_failed_is_refused_for_a_fleet(releases: list[Release]) -> None:
    with pytest.raises(DeployConfigError, match="--keep-failed is for one instance"):
        apply(fleet_config(), _no_session(), release=builder(releases[0]), keep_failed=True)


def test_long_stack_names_fit_elb_names() -> None:
    config = fleet_config(name="a-very-long-stack-name-of-32-chr")
    names = {config.elb_name(kind) for kind in ("nlb", "tls", "tcp")}
    assert len(names) == 3 and all(len(n) <= 32 for n in names)
    assert all(n.startswith("prism-a-very-long") and not n.endswith("-") for n in names)
    other = fleet_config(name="a-very-long-stack-name-of-32-chs")
    assert other.elb_name("nlb") != config.elb_name("nlb")
    assert fleet_config().elb_name("nlb") == "prism-main-nlb"


def test_the_plan_for_three_instances_is_offline() -> None:
    shown = plan(fleet_config()).to_dict()

    resources = [s["resource"] for s in shown["steps"]]
    assert "elastic-ip" not in resources and "instance" not in resources
    assert resources[-7:] == [
        "acm-certificate",
        "target-group",
        "load-balancer",
        "listener",
        "launch-template",
        "auto-scaling-group",
        "instance-refresh",
    ]
    assert shown["instances"] == 3
    refresh = shown["steps"][-1]["action"]
    assert "MinHealthyPercentage 100" in refresh and "MaxHealthyPercentage 200" in refresh
    assert "3 instances (min 3, max 3)" in shown["steps"][-2]["action"]
    assert "ACM certificate" in shown["tls"]


# --- Caddy behind the load balancer ---------------------------------------------------


@pytest.mark.skipif(shutil.which("caddy") is None, reason="needs Caddy (apt install caddy)")
def test_caddy_reads_the_load_balanced_caddyfile_as_a_catch_all(tmp_path: Any) -> None:
    path = tmp_path / "Caddyfile"
    path.write_text(render_caddyfile(DOMAIN, acme=True, load_balanced=True))

    adapted = subprocess.run(
        ["caddy", "adapt", "--config", str(path), "--adapter", "caddyfile"],
        capture_output=True,
        check=True,
        text=True,
    )

    config = json.loads(adapted.stdout)
    [server] = config["apps"]["http"]["servers"].values()
    [route] = server["routes"]
    assert "match" not in route  # any Host: the target group's checks name the IP
    [policy] = config["apps"]["tls"]["automation"]["policies"]
    assert sorted(policy["subjects"]) == sorted([DOMAIN, HEALTH_HOST])
    assert [i["module"] for i in policy["issuers"]] == ["internal"]


def test_one_instance_keeps_its_caddyfile() -> None:
    single = render_caddyfile(DOMAIN, acme=True)
    assert f"https://{DOMAIN} {{\n\ttls {{\n\t\tissuer acme" in single
    assert ":443" not in single


# --- the Typer command -------------------------------------------------------------


class _NoSession(boto3.Session):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("a boto3 session was made")


def _no_session() -> Any:
    return object()


@pytest.fixture
def cli() -> typer.Typer:
    root = typer.Typer()
    root.add_typer(deploy.app)
    return root


def test_cli_dry_run_for_three_instances_calls_nothing(
    cli: typer.Typer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(boto3, "Session", _NoSession)
    monkeypatch.setattr(deploy, "find_uv", lambda: pytest.fail("uv was looked for"))
    args = ["deploy", "origin", "--dry-run", "--instances", "3", "--domain", DOMAIN]

    shown = CliRunner().invoke(cli, [*args, "--json"], env=cli_env())
    text = CliRunner().invoke(cli, [*args, "--max", "5"], env=cli_env())

    assert shown.exit_code == 0, shown.output
    planned = json.loads(shown.stdout)
    assert planned["dry_run"] is True and planned["instances"] == 3
    assert planned["site"] == DOMAIN
    steps = {s["resource"]: s for s in planned["steps"]}
    assert steps["load-balancer"]["name"] == "prism-main-nlb"
    assert steps["auto-scaling-group"]["name"] == GROUP
    assert text.exit_code == 0, text.output
    assert "instances: 3" in text.stdout
    assert "3 instances (min 3, max 5)" in text.stdout
    assert all(value not in shown.output + text.output for value in SECRETS.values())


def test_cli_refuses_an_impossible_capacity_with_one_line(cli: typer.Typer) -> None:
    args = ["deploy", "origin", "--dry-run", "--instances", "3", "--min", "4"]
    result = CliRunner().invoke(cli, args, env=cli_env())

    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "error: need 1 <= min (4) <= instances (3) <= max (3) <= 100"
    ]


def test_cli_help_documents_the_fleet_options(cli: typer.Typer) -> None:
    result = CliRunner().invoke(cli, ["deploy", "origin", "--help"], env={"COLUMNS": "200"})

    assert result.exit_code == 0
    for option in ("--instances", "--min", "--max"):
        assert option in result.output


def test_cli_deploys_three_instances_and_says_where_to_point_the_domain(
    aws: MockAws,
    cli: typer.Typer,
    balancer_check: ThroughBalancer,
    refreshes: InstanceRefreshes,
    releases: list[Release],
    instance_lock: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The lock for these dependencies is already stored (so no resolver runs here).
    store = ReleaseStore(
        aws.client("s3"), bucket_name(aws.account_id, aws.region), "origin/main/", lambda _: None
    )
    store.ensure_bucket(aws.region, [])
    store.store_lock(lock_key(REPO, TARGET), instance_lock)
    monkeypatch.setattr(deploy, "apply", functools.partial(apply, health_check=balancer_check))
    args = ["deploy", "origin", "--ami", AMI, "--instances", "3", "--domain", DOMAIN, "--pure"]

    result = CliRunner().invoke(cli, [*args, "--source", str(REPO)], env=cli_env())

    assert result.exit_code == 0, result.output
    [balancer] = aws.client("elbv2").describe_load_balancers()["LoadBalancers"]
    lines = result.stdout.splitlines()
    assert lines[0] == f"Origin main created in {aws.region}"
    assert f"  load balancer    {balancer['DNSName']}" in lines
    assert f"  release          {releases[0].id}" in lines
    assert "  launch template  version 1" in lines
    assert lines[-1] == (
        f"Next: point DNS CNAME {DOMAIN} at {balancer['DNSName']}; edge ORIGIN_URL=https://{DOMAIN}"
    )
    assert len(group_ids(aws)) == 3
    assert all(value not in result.output for value in SECRETS.values())

    kept = CliRunner().invoke(cli, [*args, "--keep-failed", "--source", str(REPO)], env=cli_env())

    assert kept.exit_code == 2
    assert kept.stderr.strip().splitlines()[-1].startswith("error: --keep-failed is for one")
