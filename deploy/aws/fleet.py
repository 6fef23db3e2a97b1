"""A region on more than one machine (``--instances`` N > 1): a launch template, an Auto
Scaling group of N instances behind the load balancer (:mod:`deploy.aws.balancer`), and
upgrades by instance refresh.

- Launch template ``prism-origin-<name>``: one version per launch spec (AMI, type,
  profile, the user-data of one pinned, hash-checked release); its description carries
  the spec's hash and the release, so an unchanged spec reuses its version, and the
  version the group runs names the serving release.
- Auto Scaling group ``prism-origin-<name>``: an explicit template version (never
  ``$Latest``, which instance refresh cannot roll back), health check type ELB, the
  default subnets of every zone. A different N changes only its sizes.
- A new spec (or new secrets, which instances read at start) is an instance refresh that
  keeps capacity (MinHealthyPercentage 100, MaxHealthyPercentage 200: replacements come
  up before the old ones go) with AutoRollback on failed health checks; then our own
  check of the release through the load balancer. If that fails, a second refresh
  returns to the version that served before.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from botocore.exceptions import ClientError

from deploy.aws.instances import TAG_LAUNCH, TAG_RELEASE, launch_hash
from deploy.aws.releases import ReleaseStore, bucket_name
from deploy.aws.stack import (
    Action,
    DeployError,
    DeployResult,
    HealthCheck,
    OriginDeployConfig,
    Progress,
    ReleaseBuilder,
    ReleaseRef,
)

if TYPE_CHECKING:
    from mypy_boto3_ec2 import EC2Client
    from mypy_boto3_ec2.type_defs import (
        FilterTypeDef,
        LaunchTemplateTagSpecificationRequestTypeDef,
        RequestLaunchTemplateDataTypeDef,
        TagTypeDef,
    )
    from mypy_boto3_s3 import S3Client

__all__ = ["REFRESH_PREFERENCES", "FleetSteps"]

#: Keep every instance serving while the replacements start; AWS undoes a refresh whose
#: replacements fail their health checks. Warm-up: Caddy and the installed origin.
REFRESH_PREFERENCES: dict[str, Any] = {
    "MinHealthyPercentage": 100,
    "MaxHealthyPercentage": 200,
    "AutoRollback": True,
    "InstanceWarmup": 60,
}
# A first boot installs apt packages and the release: as long as the single-instance check.
_GRACE_SECONDS = 900
_REFRESH_INTERVAL = 15.0
_REFRESH_POLLS = 240  # an hour
_DONE = {"Successful", "Failed", "Cancelled", "RollbackSuccessful", "RollbackFailed"}
_DESCRIPTION = re.compile(r"^prism release (?P<release>\S+) launch (?P<launch>[0-9a-f]+)$")


class FleetSteps:
    """Mixed into the deployer, which provides these attributes and the shared steps."""

    config: OriginDeployConfig
    progress: Progress
    sleep: Callable[[float], None]
    health_check: HealthCheck
    ec2: EC2Client
    s3: S3Client
    sts: Any
    # No Auto Scaling stubs are installed; untyped.
    autoscaling: Any

    # The shared steps (deployer, access, balancer, instances).
    def tags(self, *extra: TagTypeDef) -> list[TagTypeDef]:
        raise NotImplementedError

    def filters(self) -> list[FilterTypeDef]:
        raise NotImplementedError

    def security_group(self) -> str:
        raise NotImplementedError

    def parameters(self) -> tuple[list[str], list[str]]:
        raise NotImplementedError

    def instance_profile(self, *, partition: str, account: str, bucket: str) -> tuple[str, bool]:
        raise NotImplementedError

    def release(self, store: ReleaseStore, build: ReleaseBuilder, lock_key: str) -> ReleaseRef:
        raise NotImplementedError

    def previous(self, store: ReleaseStore, serving: str | None) -> ReleaseRef:
        raise NotImplementedError

    def resolve_ami(self) -> str:
        raise NotImplementedError

    def subnets(self) -> tuple[str, list[str]]:
        raise NotImplementedError

    def certificate(self) -> str:
        raise NotImplementedError

    def target_group(self, vpc_id: str) -> str:
        raise NotImplementedError

    def load_balancer(self, subnets: list[str]) -> tuple[str, str]:
        raise NotImplementedError

    def listener(self, balancer: str, target_group: str, certificate: str | None) -> bool:
        raise NotImplementedError

    def group(self) -> dict[str, Any] | None:
        """The stack's Auto Scaling group, if any."""
        found = self.autoscaling.describe_auto_scaling_groups(
            AutoScalingGroupNames=[self.config.fleet_name]
        )["AutoScalingGroups"]
        return cast("dict[str, Any]", found[0]) if found else None

    def run_fleet(
        self, build: ReleaseBuilder | None, lock_key: str, *, rollback: bool
    ) -> DeployResult:
        config, progress = self.config, self.progress
        progress("Checking AWS credentials")
        arn: str = self.sts.get_caller_identity()["Arn"]
        partition, account = arn.split(":")[1], arn.split(":")[4]
        if self.ec2.describe_addresses(Filters=self.filters())["Addresses"]:
            raise DeployError(
                f"origin {config.name} in {config.region} runs on one instance with an "
                "Elastic IP; deploy the fleet as another stack (--name) and point the "
                "domain at its load balancer"
            )
        group_id = self.security_group()
        changed, kept = self.parameters()
        store = ReleaseStore(
            self.s3, bucket_name(account, config.region), config.release_prefix, progress
        )
        store.ensure_bucket(
            config.region, [{"Key": t["Key"], "Value": t["Value"]} for t in config.tags()]
        )
        profile, _ = self.instance_profile(
            partition=partition, account=account, bucket=store.bucket
        )
        certificate = self.certificate() if config.domain else None
        vpc_id, subnets = self.subnets()
        target_group = self.target_group(vpc_id)
        balancer, dns = self.load_balancer(subnets)
        listener_changed = self.listener(balancer, target_group, certificate)

        group = self.group()
        versions = self.template_versions()
        serving = _serving_version(group, versions)
        serving_release = _described(versions[serving])["release"] if serving else None
        if rollback:
            ref = self.previous(store, serving_release)
        else:
            assert build is not None
            ref = self.release(store, build, lock_key)
        user_data = config.user_data(config.domain or dns, store.bucket, ref)
        launch = launch_hash(config, user_data)
        version = next((n for n, v in versions.items() if _described(v)["launch"] == launch), None)
        if version is None:
            version = self.new_version(bool(versions), ref, launch, group_id, profile, user_data)

        action: Action = "unchanged"
        refresh_id: str | None = None
        if group is None:
            self.create_group(version, target_group, subnets)
            self.check_through(dns, ref, previous=None)
            action = "created"
        else:
            if self.resize(group):
                action = "updated"
            if version != serving or changed:
                why = f"release {ref.id}" if version != serving else "new secrets"
                refresh_id = self.refresh_instances(version, why=why, fresh=version == serving)
                assert serving is not None
                self.check_through(dns, ref, previous=(serving, serving_release))
                action = "replaced" if version != serving else "updated"
            elif listener_changed:
                action = "updated"
        self.make_default(version)
        history = store.history()
        if not history or history[-1].id != ref.id:
            store.record(ref)
        final = self.group() or {}
        return DeployResult(
            region=config.region,
            name=config.name,
            action=action,
            instance_id="",
            public_ip="",
            public_dns=dns,
            url=f"https://{config.domain or dns}",
            security_group_id=group_id,
            allocation_id="",
            instance_profile=profile,
            release=ref.id,
            previous_release=serving_release if serving_release != ref.id else None,
            bucket=store.bucket,
            parameter_names=config.parameter_names,
            parameters_changed=tuple(changed),
            parameters_kept=tuple(kept),
            restarted=refresh_id is not None and version == serving,
            rolled_back=rollback,
            instances=config.instances,
            instance_ids=tuple(sorted(i["InstanceId"] for i in final.get("Instances", []))),
            load_balancer=dns,
            launch_template_version=version,
            instance_refresh_id=refresh_id,
            certificate_arn=certificate,
        )

    def template_versions(self) -> dict[int, dict[str, Any]]:
        """The launch template's versions by number (none if there is no template)."""
        try:
            pages = self.ec2.get_paginator("describe_launch_template_versions").paginate(
                LaunchTemplateName=self.config.fleet_name
            )
            found = [v for page in pages for v in page["LaunchTemplateVersions"]]
        except ClientError as error:
            if "NotFound" not in str(error.response.get("Error", {}).get("Code", "")):
                raise
            return {}
        return {int(v["VersionNumber"]): dict(v) for v in found if _described(dict(v))["launch"]}

    def new_version(
        self,
        exists: bool,
        ref: ReleaseRef,
        launch: str,
        group_id: str,
        profile: str,
        user_data: str,
    ) -> int:
        """A launch template version for this spec (the template on the first)."""
        config = self.config
        ami = config.ami or self.resolve_ami()
        identity: list[TagTypeDef] = [
            {"Key": TAG_LAUNCH, "Value": launch},
            {"Key": TAG_RELEASE, "Value": ref.id},
            {"Key": "prism:image", "Value": ref.image},
            {"Key": "prism:python", "Value": ref.python},
        ]
        specs: list[LaunchTemplateTagSpecificationRequestTypeDef] = [
            {"ResourceType": "instance", "Tags": self.tags(*identity)},
            {"ResourceType": "volume", "Tags": self.tags()},
        ]
        data = cast(
            "RequestLaunchTemplateDataTypeDef",
            {
                "ImageId": ami,
                "InstanceType": config.instance_type,
                "IamInstanceProfile": {"Name": profile},
                # Launch templates take user-data encoded (RunInstances encodes it itself).
                "UserData": base64.b64encode(user_data.encode()).decode(),
                # A public address: the default VPC has no NAT, and the instance reaches
                # apt, S3, SSM and the providers itself.
                "NetworkInterfaces": [
                    {"DeviceIndex": 0, "AssociatePublicIpAddress": True, "Groups": [group_id]}
                ],
                "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
                "TagSpecifications": specs,
            },
        )
        description = f"prism release {ref.id} launch {launch}"
        name = config.fleet_name
        if not exists:
            self.progress(f"Creating launch template {name} for release {ref.id} ({ami})")
            created = self.ec2.create_launch_template(
                LaunchTemplateName=name,
                VersionDescription=description,
                LaunchTemplateData=data,
                TagSpecifications=[{"ResourceType": "launch-template", "Tags": self.tags()}],
            )
            return int(created["LaunchTemplate"]["LatestVersionNumber"])
        self.progress(f"Adding a launch template version for release {ref.id} ({ami})")
        added = self.ec2.create_launch_template_version(
            LaunchTemplateName=name, VersionDescription=description, LaunchTemplateData=data
        )
        return int(added["LaunchTemplateVersion"]["VersionNumber"])

    def create_group(self, version: int, target_group: str, subnets: list[str]) -> None:
        config = self.config
        low, desired, high = config.capacity
        self.progress(
            f"Creating Auto Scaling group {config.fleet_name}: {desired} instances "
            f"(min {low}, max {high}) over {len(subnets)} zones"
        )
        self.autoscaling.create_auto_scaling_group(
            AutoScalingGroupName=config.fleet_name,
            LaunchTemplate={"LaunchTemplateName": config.fleet_name, "Version": str(version)},
            MinSize=low,
            MaxSize=high,
            DesiredCapacity=desired,
            VPCZoneIdentifier=",".join(subnets),
            TargetGroupARNs=[target_group],
            HealthCheckType="ELB",
            HealthCheckGracePeriod=_GRACE_SECONDS,
            Tags=[
                {
                    "ResourceId": config.fleet_name,
                    "ResourceType": "auto-scaling-group",
                    "Key": t["Key"],
                    "Value": t["Value"],
                    "PropagateAtLaunch": False,  # the launch template tags the instances
                }
                for t in config.tags()
            ],
        )

    def resize(self, group: dict[str, Any]) -> bool:
        """Set the group's sizes to the configured ones; True if they changed."""
        low, desired, high = self.config.capacity
        if (group["MinSize"], group["DesiredCapacity"], group["MaxSize"]) == (low, desired, high):
            return False
        self.progress(
            f"Resizing {self.config.fleet_name} from {group['DesiredCapacity']} to {desired} "
            f"instances (min {low}, max {high})"
        )
        self.autoscaling.update_auto_scaling_group(
            AutoScalingGroupName=self.config.fleet_name,
            MinSize=low,
            MaxSize=high,
            DesiredCapacity=desired,
        )
        return True

    def refresh_instances(self, version: int, *, why: str, fresh: bool) -> str:
        """Replace the group's instances with ``version``'s, keeping capacity; the refresh
        id once it succeeded. ``fresh``: replace even instances already on ``version``."""
        name = self.config.fleet_name
        for earlier in self.autoscaling.describe_instance_refreshes(AutoScalingGroupName=name)[
            "InstanceRefreshes"
        ]:
            if earlier["Status"] not in _DONE:
                raise DeployError(
                    f"instance refresh {earlier['InstanceRefreshId']} of {name} is "
                    f"{earlier['Status']}; wait for it or cancel it "
                    "(aws autoscaling cancel-instance-refresh)"
                )
        self.progress(f"Starting an instance refresh of {name} to version {version} ({why})")
        refresh_id = str(
            self.autoscaling.start_instance_refresh(
                AutoScalingGroupName=name,
                Strategy="Rolling",
                DesiredConfiguration={
                    "LaunchTemplate": {"LaunchTemplateName": name, "Version": str(version)}
                },
                Preferences={**REFRESH_PREFERENCES, "SkipMatching": not fresh},
            )["InstanceRefreshId"]
        )
        status, reason = self.await_refresh(refresh_id)
        if status != "Successful":
            undone = {
                "RollbackSuccessful": "AWS rolled it back; the previous instances serve",
                "RollbackFailed": "its rollback failed too: check the group in the console",
            }.get(status, "the instances it had not replaced yet keep serving")
            raise DeployError(
                f"instance refresh {refresh_id} to version {version} ({why}) ended "
                f"{status}: {reason or 'no reason given'}; {undone}"
            )
        return refresh_id

    def await_refresh(self, refresh_id: str) -> tuple[str, str]:
        name, last = self.config.fleet_name, ""
        for _ in range(_REFRESH_POLLS):
            [found] = self.autoscaling.describe_instance_refreshes(
                AutoScalingGroupName=name, InstanceRefreshIds=[refresh_id]
            )["InstanceRefreshes"]
            status = str(found["Status"])
            if status in _DONE:
                return status, str(found.get("StatusReason", ""))
            now = f"{status}, {found.get('PercentageComplete', 0)}% done"
            if now != last:
                self.progress(f"Instance refresh {refresh_id}: {now}")
                last = now
            self.sleep(_REFRESH_INTERVAL)
        raise DeployError(f"instance refresh {refresh_id} of {name} did not finish in an hour")

    def check_through(
        self, dns: str, ref: ReleaseRef, *, previous: tuple[int, str | None] | None
    ) -> None:
        """Our own check of the release through the load balancer; on failure, refresh
        back to ``previous`` (version, release) if there is one, then raise."""
        self.progress(f"Waiting for https://{dns}/healthz to report release {ref.id}")
        problem = self.health_check(dns, ref.id)
        if problem is None:
            self.progress(f"The load balancer serves release {ref.id}")
            return
        if previous is None:
            raise DeployError(
                f"release {ref.id} failed its health check through the load balancer {dns}: "
                f"{problem}; nothing served before (fix it and deploy again)"
            )
        version, release = previous
        self.progress(f"Release {ref.id} is not healthy ({problem}); returning to {release}")
        self.refresh_instances(version, why=f"back to release {release}", fresh=False)
        self.make_default(version)
        raise DeployError(
            f"release {ref.id} failed its health check through the load balancer {dns}: "
            f"{problem}; rolled back to release {release} (launch template version {version})"
        )

    def make_default(self, version: int) -> None:
        """Make ``version`` the template's default, so ``$Default`` names what serves."""
        [template] = self.ec2.describe_launch_templates(
            LaunchTemplateNames=[self.config.fleet_name]
        )["LaunchTemplates"]
        if int(template["DefaultVersionNumber"]) != version:
            self.ec2.modify_launch_template(
                LaunchTemplateName=self.config.fleet_name, DefaultVersion=str(version)
            )


def _described(version: dict[str, Any]) -> dict[str, str]:
    """The release and launch hash a version's description records (empty if not ours)."""
    match = _DESCRIPTION.match(str(version.get("VersionDescription", "")))
    return match.groupdict() if match else {"release": "", "launch": ""}


def _serving_version(group: dict[str, Any] | None, versions: dict[int, Any]) -> int | None:
    """The template version the group runs (None without a group)."""
    if group is None:
        return None
    spec = group.get("LaunchTemplate") or {}
    try:
        version = int(spec.get("Version", ""))
    except ValueError:
        raise DeployError(
            f"Auto Scaling group {group['AutoScalingGroupName']} names launch template "
            f"version {spec.get('Version')!r}, not a number this deploy set"
        ) from None
    if version not in versions:
        raise DeployError(f"launch template version {version} is not one this deploy made")
    return version
