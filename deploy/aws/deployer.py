"""The AWS steps of ``prism deploy origin``, run in order by ``Deployer``: secrets, release
and address (the access steps are in :mod:`deploy.aws.access`, the blue/green instance swap
in :mod:`deploy.aws.instances`; a fleet's run in :mod:`deploy.aws.fleet`, its load balancer
in :mod:`deploy.aws.balancer`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from deploy.aws.access import AccessSteps
from deploy.aws.balancer import BalancerSteps
from deploy.aws.fleet import FleetSteps
from deploy.aws.instances import TAG_LAUNCH, TAG_RELEASE, InstanceSteps, instance_tag, launch_hash
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
    import boto3
    from mypy_boto3_ec2 import EC2Client
    from mypy_boto3_ec2.type_defs import (
        FilterTypeDef,
        TagSpecificationTypeDef,
        TagTypeDef,
    )
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_ssm import SSMClient

__all__ = ["Deployer"]


def _code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", "Unknown"))


class Deployer(AccessSteps, InstanceSteps, BalancerSteps, FleetSteps):
    """One ``apply`` run: the clients, the config and the progress sink, shared by the steps."""

    def __init__(
        self,
        config: OriginDeployConfig,
        session: boto3.Session,
        progress: Progress,
        sleep: Callable[[float], None],
        *,
        health_check: HealthCheck,
        keep_failed: bool = False,
    ) -> None:
        self.config, self.progress, self.sleep = config, progress, sleep
        self.health_check, self.keep_failed = health_check, keep_failed
        self.ec2: EC2Client = session.client("ec2", region_name=config.region)
        self.ssm: SSMClient = session.client("ssm", region_name=config.region)
        self.s3: S3Client = session.client("s3", region_name=config.region)
        # No IAM/STS stubs are installed; these two stay untyped.
        self.iam: Any = session.client("iam", region_name=config.region)
        self.sts: Any = session.client("sts", region_name=config.region)
        self.autoscaling: Any = session.client("autoscaling", region_name=config.region)
        self.elbv2: Any = session.client("elbv2", region_name=config.region)
        self.acm: Any = session.client("acm", region_name=config.region)

    def run(self, build: ReleaseBuilder | None, lock_key: str, *, rollback: bool) -> DeployResult:
        if self.config.fleet:
            return self.run_fleet(build, lock_key, rollback=rollback)
        config, progress = self.config, self.progress
        progress("Checking AWS credentials")
        arn: str = self.sts.get_caller_identity()["Arn"]
        partition, account = arn.split(":")[1], arn.split(":")[4]
        if self.group() is not None:
            raise DeployError(
                f"origin {config.name} in {config.region} runs as an Auto Scaling group "
                f"({config.fleet_name}); give --instances 2 or more to update it"
            )
        group_id = self.security_group()
        changed, kept = self.parameters()
        store = ReleaseStore(
            self.s3, bucket_name(account, config.region), config.release_prefix, progress
        )
        store.ensure_bucket(
            config.region, [{"Key": t["Key"], "Value": t["Value"]} for t in config.tags()]
        )
        allocation_id, public_ip = self.elastic_ip()
        instances = self.instances()
        serving = self.serving(instances, allocation_id)
        serving_release = instance_tag(serving, TAG_RELEASE) if serving else None
        if rollback:
            ref = self.previous(store, serving_release)
        else:
            assert build is not None
            ref = self.release(store, build, lock_key)
        profile, profile_is_new = self.instance_profile(
            partition=partition, account=account, bucket=store.bucket
        )
        user_data = config.user_data(config.domain or public_ip, store.bucket, ref)
        launch = launch_hash(config, user_data)

        restarted = False
        action: Action = "unchanged"
        if serving is not None and instance_tag(serving, TAG_LAUNCH) == launch:
            instance_id = serving["InstanceId"]
            progress(f"Release {ref.id} already serves on {instance_id}")
            restarted = self.refresh(serving, secrets_changed=bool(changed))
            if changed or restarted:
                action = "updated"
        else:
            instance_id = self.bring_up(
                instances, ref, launch, group_id, profile, user_data, retry=profile_is_new
            )
            self.associate(allocation_id, instance_id)
            action = "replaced" if serving is not None else "created"
        history = store.history()
        if not history or history[-1].id != ref.id:
            store.record(ref)
        stale = tuple(i["InstanceId"] for i in instances if i["InstanceId"] != instance_id)
        if stale:
            progress(f"Terminating previous instance(s) {', '.join(stale)}")
            self.ec2.terminate_instances(InstanceIds=list(stale))
            if action == "unchanged":
                action = "updated"

        final = self.ec2.describe_instances(InstanceIds=[instance_id])
        instance = final["Reservations"][0]["Instances"][0]
        ip = instance.get("PublicIpAddress") or public_ip
        return DeployResult(
            region=config.region,
            name=config.name,
            action=action,
            instance_id=instance_id,
            public_ip=ip,
            public_dns=instance.get("PublicDnsName") or None,
            url=f"https://{config.domain or ip}",
            security_group_id=group_id,
            allocation_id=allocation_id,
            instance_profile=profile,
            release=ref.id,
            previous_release=serving_release if serving_release != ref.id else None,
            bucket=store.bucket,
            parameter_names=config.parameter_names,
            parameters_changed=tuple(changed),
            parameters_kept=tuple(kept),
            restarted=restarted,
            rolled_back=rollback,
            terminated_instance_ids=stale,
        )

    def release(self, store: ReleaseStore, build: ReleaseBuilder, lock_key: str) -> ReleaseRef:
        """Build this checkout's release (reusing the stored lock) and store it."""
        target = self.config.target
        cached = store.lock(lock_key) if lock_key else None
        if cached is None:
            self.progress(
                f"Building the wheel and pinning its dependencies for Python {target.python} "
                f"on {target.platform}"
            )
        else:
            self.progress(f"Building the wheel (dependencies unchanged: reusing lock {lock_key})")
        release = build(cached)
        self.progress(f"Release {release.id}: {release.wheel_name}, {release.note}")
        if cached is None and lock_key:
            store.store_lock(lock_key, release.lock)
        if not store.store(release):
            self.progress(f"Release {release.id} is already stored")
        return ReleaseRef.of(release)

    def previous(self, store: ReleaseStore, serving: str | None) -> ReleaseRef:
        """The release that served before ``serving`` (for ``--rollback``)."""
        if serving is None:
            raise DeployError(f"nothing to roll back: no origin {self.config.name} serves")
        earlier = [r for r in store.history() if r.id != serving]
        if not earlier:
            raise DeployError(f"nothing to roll back to: release {serving} is the only one")
        ref = earlier[-1]
        if not store.stored(ref):
            raise DeployError(f"release {ref.id} is no longer stored in s3://{store.bucket}")
        self.progress(f"Rolling back from release {serving} to {ref.id}")
        return ref

    def tags(self, *extra: TagTypeDef) -> list[TagTypeDef]:
        """The stack tags plus a console ``Name``."""
        name: TagTypeDef = {"Key": "Name", "Value": self.config.security_group_name}
        return [*self.config.tags(), name, *extra]

    def parameters(self) -> tuple[list[str], list[str]]:
        """Store the configured secrets; keep the others. Return (names changed, names kept)."""
        config, ssm = self.config, self.ssm
        wanted = {f"{config.parameter_path}/{k}": v for k, v in config.secrets.items()}
        names, current = sorted(wanted), dict[str, tuple[str, str]]()
        for i in range(0, len(names), 10):  # GetParameters takes at most 10 names
            found = ssm.get_parameters(Names=names[i : i + 10], WithDecryption=True)
            current.update({p["Name"]: (p["Type"], p["Value"]) for p in found["Parameters"]})
        changed: list[str] = []
        for name in names:
            if current.get(name) == ("SecureString", wanted[name]):
                continue
            exists = name in current
            self.progress(f"{'Updating' if exists else 'Creating'} SSM parameter {name}")
            # SSM refuses Tags together with Overwrite: tag on create only.
            tagged = {"Tags": [{"Key": t["Key"], "Value": t["Value"]} for t in config.tags()]}
            extra: dict[str, Any] = {"Overwrite": True} if exists else tagged
            try:
                ssm.put_parameter(
                    Name=name,
                    Value=wanted[name],
                    Type="SecureString",
                    **extra,
                    Tier="Intelligent-Tiering",
                    Description="Prism origin secret",
                )
            except ClientError as error:
                # Raised afresh: the original's request context holds the value.
                raise DeployError(f"could not store SSM parameter {name}: {_code(error)}") from None
            changed.append(name)
        removed = {f"{config.parameter_path}/{n}" for n in config.remove_secrets}
        kept: list[str] = []
        pages = ssm.get_paginator("get_parameters_by_path").paginate(Path=config.parameter_path)
        for stored in sorted(p["Name"] for page in pages for p in page["Parameters"]):
            if stored in wanted:
                continue
            if stored in removed:
                self.progress(f"Deleting SSM parameter {stored} (--remove-secret)")
                ssm.delete_parameter(Name=stored)
                changed.append(stored)
            else:
                # A re-deploy without a secret in its environment never drops it.
                self.progress(f"Keeping stored SSM parameter {stored} (not set in this deploy)")
                kept.append(stored)
        if not changed:
            self.progress(f"SSM parameters under {config.parameter_path} are up to date")
        return changed, kept

    def elastic_ip(self) -> tuple[str, str]:
        """The stack's Elastic IP (allocation id, address), allocated once."""
        found = self.ec2.describe_addresses(Filters=self.filters())["Addresses"]
        if found:
            self.progress(f"Reusing Elastic IP {found[0]['PublicIp']}")
            return found[0]["AllocationId"], found[0]["PublicIp"]
        self.progress("Allocating an Elastic IP")
        spec: TagSpecificationTypeDef = {"ResourceType": "elastic-ip", "Tags": self.tags()}
        address = self.ec2.allocate_address(Domain="vpc", TagSpecifications=[spec])
        return address["AllocationId"], address["PublicIp"]

    def filters(self) -> list[FilterTypeDef]:
        return [{"Name": f"tag:{t['Key']}", "Values": [t["Value"]]} for t in self.config.tags()]
